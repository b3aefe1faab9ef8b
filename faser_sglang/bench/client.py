"""Replay a workload on an arrival trace against one server and time every request.

Each request is sent at its arrival offset as a streaming ``/generate`` call (its own
thread, so a slow request never delays the next arrival). The first streamed chunk
gives TTFT; every chunk's cumulative ``completion_tokens`` gives the token timeline
used for windowed throughput; the last chunk carries the output ids and SGLang's
speculative metadata. A poller samples the server's running batch size.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

import requests


class Prompted(Protocol):
    prompt: str
    max_new_tokens: int


@dataclass
class RequestTiming:
    index: int
    arrival: float  # scheduled offset from the run start, seconds
    sent: float  # actual send time, seconds since run start
    first_token: Optional[float] = None  # seconds since run start
    finished: Optional[float] = None
    output_ids: list[int] = field(default_factory=list)
    token_times: list[tuple[float, int]] = field(default_factory=list)  # (t, cumulative tokens)
    meta: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def e2e(self) -> Optional[float]:
        return None if self.finished is None else self.finished - self.sent

    @property
    def tpot(self) -> Optional[float]:
        if self.finished is None or self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LoadSample:
    t: float
    running: int
    waiting: int


@dataclass(frozen=True)
class ReplayResult:
    timings: list[RequestTiming]
    load: list[LoadSample]
    duration: float


def replay(
    base_url: str,
    workload: Sequence[Prompted],
    arrivals: Sequence[float],
    sampling: Mapping[str, Any],
    *,
    timeout: float = 1800.0,
    poll_interval: float = 0.5,
    max_workers: int = 512,
) -> ReplayResult:
    """Send workload[i] at arrivals[i] seconds after the start; wait for all."""
    if len(workload) != len(arrivals):
        raise ValueError(f"{len(workload)} requests but {len(arrivals)} arrival times")
    start = time.monotonic()
    done = threading.Event()
    load: list[LoadSample] = []
    poller = threading.Thread(target=_poll_load, args=(base_url, start, done, poll_interval, load), daemon=True)
    poller.start()
    order = sorted(range(len(workload)), key=lambda i: arrivals[i])
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = [
            pool.submit(_one, base_url, i, workload[i], arrivals[i], sampling, start, timeout)
            for i in order
        ]
        timings = [f.result() for f in futures]
    duration = time.monotonic() - start
    done.set()
    poller.join(timeout=5)
    timings.sort(key=lambda t: t.index)
    return ReplayResult(timings, load, duration)


def _one(base_url, index, req: Prompted, arrival, sampling, start, timeout) -> RequestTiming:
    delay = start + arrival - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    timing = RequestTiming(index=index, arrival=arrival, sent=time.monotonic() - start)
    payload = {
        "text": req.prompt,
        "sampling_params": {**sampling, "max_new_tokens": req.max_new_tokens},
        "stream": True,
    }
    try:
        with requests.post(base_url + "/generate", json=payload, stream=True, timeout=timeout) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[len(b"data: ") :])
                now = time.monotonic() - start
                meta = chunk.get("meta_info", {})
                tokens = int(meta.get("completion_tokens", 0))
                if timing.first_token is None and tokens > 0:
                    timing.first_token = now
                timing.token_times.append((now, tokens))
                timing.meta = meta
                if "output_ids" in chunk:
                    timing.output_ids = list(chunk["output_ids"])
        timing.finished = time.monotonic() - start
    except (requests.RequestException, ValueError) as e:
        timing.error = f"{type(e).__name__}: {e}"
    return timing


def _poll_load(base_url, start, done, interval, out: list[LoadSample]) -> None:
    while not done.is_set():
        try:
            loads = requests.get(base_url + "/v1/loads", timeout=5).json()["loads"]
            out.append(
                LoadSample(
                    t=time.monotonic() - start,
                    running=sum(int(x.get("num_running_reqs", 0)) for x in loads),
                    waiting=sum(int(x.get("num_waiting_reqs", 0)) for x in loads),
                )
            )
        except (requests.RequestException, ValueError, KeyError):
            pass
        done.wait(interval)
