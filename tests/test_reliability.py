"""FASER under aborts, client disconnects and KV-memory pressure.

The FASER draft shares the target's request-to-token map and slot allocator, so a
KV slot leaked by either model shows up in SGLang's own accounting: after the load
drains and the radix cache is flushed, ``/v1/loads`` must report zero used tokens and
no running or waiting request.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import requests

from faser_sglang.bench.health import wait_until_drained
from faser_sglang.bench.servers import Server
from fuzz_utils import (
    faser_flags,
    outputs_of,
    post_generate,
    servers_together,
    vocab_size,
)
from server_utils import launch_server

pytestmark = pytest.mark.server

K_MAX = 4
SMALL_POOL = ("--max-total-tokens", "1500", "--max-running-requests", "16")
# Admit requests as if they will generate few tokens, and return to that optimism
# soon after a retraction.
OPTIMISTIC_ADMISSION = {"SGLANG_INIT_NEW_TOKEN_RATIO": "0.05", "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "10"}
RETRACT_LOG_LINE = "KV cache pool is full. Retract requests."
PRESSURE_NEW_TOKENS = 32
LONG = {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}  # outlives any abort below
# 24 clients, more than --max-running-requests: some wait in the queue when they leave.
CHAOS_MIX = {"stream_close": 6, "abort_rid": 5, "timeout_close": 5, "greedy": 6, "sampled": 2}


def _random_ids(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(6, 500) for _ in range(rng.randint(low, high))]


def _send_batch(base_url: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """POST every request as one batched ``/generate`` call; answers in request order.

    Pre-tokenized batches reach the scheduler as one message, so all requests wait in
    the same queue from the first step however slow the client machine is; separate
    HTTP requests can trickle in so slowly that early ones finish before late ones
    arrive, and the pool is then never under pressure."""
    batch = {
        "input_ids": [p["input_ids"] for p in payloads],
        "sampling_params": [p["sampling_params"] for p in payloads],
    }
    r = post_generate(base_url, batch)
    r.raise_for_status()
    return outputs_of(r.json())


# ---------------------------------------------------------------------------
# Memory pressure: SGLang retracts requests when the KV pool runs out
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_pool_servers(tiny_models):
    """(no-spec, FASER) with the same small KV pool, admitting requests optimistically
    so that SGLang really runs out of KV slots mid-decode and retracts requests."""
    with servers_together(
        lambda: launch_server(tiny_models.target, *SMALL_POOL, env=OPTIMISTIC_ADMISSION),
        lambda: launch_server(
            tiny_models.target, *faser_flags(tiny_models.draft, K_MAX), *SMALL_POOL, env=OPTIMISTIC_ADMISSION
        ),
    ) as pair:
        yield pair


def _retraction_log_lines(server: Server) -> int:
    return server.log_path.read_text(errors="replace").count(RETRACT_LOG_LINE)


def _pressure_workload() -> list[dict[str, Any]]:
    """20 concurrent requests (16 greedy, 4 sampled) needing ~3400 KV slots in all."""
    rng = random.Random(7)
    greedy = {"max_new_tokens": PRESSURE_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    sampled = {"max_new_tokens": PRESSURE_NEW_TOKENS, "temperature": 0.8, "top_p": 0.9, "ignore_eos": True}
    return [
        {"input_ids": _random_ids(rng, 120, 160), "sampling_params": greedy if i < 16 else sampled}
        for i in range(20)
    ]


def test_retraction_under_memory_pressure_keeps_output_lossless(tiny_models, small_pool_servers) -> None:
    small_nospec, small_faser = small_pool_servers
    retract_lines_before = _retraction_log_lines(small_faser)
    payloads = _pressure_workload()
    reference = _send_batch(small_nospec.base_url, payloads)
    got = _send_batch(small_faser.base_url, payloads)

    retractions = [o["meta_info"]["num_retractions"] for o in got]
    assert sum(retractions) > 0, "FASER never retracted: the pool was not under pressure"
    assert _retraction_log_lines(small_faser) > retract_lines_before

    greedy = [i for i, p in enumerate(payloads) if p["sampling_params"]["temperature"] == 0]
    mismatched = [i for i in greedy if got[i]["output_ids"] != reference[i]["output_ids"]]
    assert not mismatched, (
        f"greedy outputs differ from no-spec for requests {mismatched} "
        f"(retractions per request: {retractions})"
    )
    vocab = vocab_size(tiny_models.target)
    for out in got:
        assert len(out["output_ids"]) == PRESSURE_NEW_TOKENS
        assert all(0 <= t < vocab for t in out["output_ids"])

    final = wait_until_drained(small_faser.base_url)
    assert final.idle and final.used_tokens == 0, f"after retractions: {final}"


# ---------------------------------------------------------------------------
# Aborts and disconnects
# ---------------------------------------------------------------------------


class Chaos:
    """Requests that leave early in every way a client can, mixed with requests that
    run to completion; ``completed`` keeps each finished greedy request and output."""

    def __init__(self, base_url: str, rng: random.Random) -> None:
        self.base_url = base_url
        self.rng = rng
        self.completed: list[tuple[dict[str, Any], list[int]]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def run(self, mix: dict[str, int]) -> None:
        """Start ``mix[kind]`` clients of each kind, shuffled, and wait for all of them."""
        kinds = [kind for kind, count in mix.items() for _ in range(count)]
        self.rng.shuffle(kinds)
        actors = [self.actor(kind) for kind in kinds]
        threads = [threading.Thread(target=self._guarded, args=(a,)) for a in actors]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _guarded(self, actor: Callable[[], None]) -> None:
        try:
            actor()
        except Exception as e:  # noqa: BLE001 - a client-side failure is a finding
            self._expect(False, f"client failed: {e!r}")

    def actor(self, kind: str) -> Callable[[], None]:
        """A client of ``kind`` with its random parameters drawn now (deterministic per seed)."""
        rng = random.Random(self.rng.random())
        payload: dict[str, Any] = {"input_ids": _random_ids(rng, 1, 100), "sampling_params": dict(LONG)}
        delay = rng.uniform(0.0, 4.0)
        if kind == "stream_close":
            return partial(self._stream_close, payload, delay, chunks=rng.randint(0, 12))
        if kind == "abort_rid":
            return partial(self._abort_rid, payload, delay, after=rng.uniform(0.05, 1.0))
        if kind == "timeout_close":
            return partial(self._timeout_close, payload, delay, wait=rng.uniform(0.5, 3.0))
        params = {"max_new_tokens": rng.randint(8, 32), "temperature": 0, "ignore_eos": True}
        if kind == "sampled":
            params.update(temperature=0.8, n=2)
        return partial(self._normal, {**payload, "sampling_params": params}, delay)

    def _stream_close(self, payload: dict[str, Any], delay: float, chunks: int) -> None:
        """Read ``chunks`` streamed chunks (0: only the headers), then hang up."""
        time.sleep(delay)
        with requests.post(
            f"{self.base_url}/generate", json={**payload, "stream": True}, stream=True, timeout=120
        ) as r:
            self._expect(r.status_code == 200, f"stream answered {r.status_code}")
            seen = 0
            for line in r.iter_lines():
                if seen >= chunks:
                    break
                seen += bool(line)

    def _abort_rid(self, payload: dict[str, Any], delay: float, after: float) -> None:
        """A streamed request that ``/abort_request`` cancels by rid ``after`` seconds
        into its generation; its stream must end with finish reason "abort"."""
        time.sleep(delay)
        rid = uuid.uuid4().hex
        body = {**payload, "rid": rid, "stream": True}
        with requests.post(f"{self.base_url}/generate", json=body, stream=True, timeout=120) as r:
            chunks = (line for line in r.iter_lines() if line.startswith(b"data: {"))
            last = next(chunks)  # generating: the server knows the rid now
            time.sleep(after)
            requests.post(f"{self.base_url}/abort_request", json={"rid": rid}, timeout=60)
            for last in chunks:
                pass
        reason = json.loads(last[len(b"data: "):])["meta_info"]["finish_reason"]
        self._expect(reason is not None and reason["type"] == "abort", f"aborted stream ended with {reason}")

    def _timeout_close(self, payload: dict[str, Any], delay: float, wait: float) -> None:
        """A blocking request whose client gives up after ``wait`` seconds."""
        time.sleep(delay)
        try:
            post_generate(self.base_url, payload, timeout=wait)
        except requests.exceptions.Timeout:
            return

    def _normal(self, payload: dict[str, Any], delay: float) -> None:
        time.sleep(delay)
        r = post_generate(self.base_url, payload, timeout=600)
        if not self._expect(r.status_code == 200, f"normal request answered {r.status_code}: {r.text[:200]}"):
            return
        params = payload["sampling_params"]
        outs = outputs_of(r.json())
        lengths = [len(o["output_ids"]) for o in outs]
        self._expect(
            lengths == [params["max_new_tokens"]] * params.get("n", 1),
            f"normal request got lengths {lengths} for {params}",
        )
        if params["temperature"] == 0:
            with self._lock:
                self.completed.append((payload, outs[0]["output_ids"]))

    def _expect(self, ok: bool, message: str) -> bool:
        if not ok:
            with self._lock:
                self.errors.append(message)
        return ok


@pytest.fixture(scope="module")
def faser(tiny_models):
    with launch_server(tiny_models.target, *faser_flags(tiny_models.draft, K_MAX)) as server:
        yield server


@pytest.mark.parametrize("seed", [0, 1])
def test_aborts_and_disconnects_free_every_slot(faser, seed: int) -> None:
    """Streams closed after a random number of chunks, ``/abort_request`` by rid,
    clients that time out, and normal requests, all starting at random times."""
    chaos = Chaos(faser.base_url, random.Random(seed))
    chaos.run(CHAOS_MIX)
    assert not chaos.errors, chaos.errors

    final = wait_until_drained(faser.base_url)
    assert final.idle, f"requests stuck after every client left: {final}"
    assert final.used_tokens == 0, f"{final.used_tokens} KV slots still held after the load drained"

    # The server still serves, and greedy output did not depend on the chaos around it.
    payloads = [payload for payload, _ in chaos.completed]
    after = [out["output_ids"] for out in _send_batch(faser.base_url, payloads)]
    changed = [p for p, (_, during), a in zip(payloads, chaos.completed, after) if a != during]
    assert not changed, f"greedy output changed after the chaos for {changed}"
