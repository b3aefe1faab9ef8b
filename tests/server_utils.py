"""Launch real SGLang servers on this CPU-only host and talk to them.

Servers are the product's own launcher (``faser_sglang.bench.servers.launch``) with
the flags that make SGLang 0.5.17 serve float32 models on CPU through the
``faser-cpu-harness`` plugin (``tests/cpu_harness``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from faser_sglang.bench.servers import Server, launch

# --max-total-tokens keeps the KV pool small; --mem-fraction-static must still
# exceed what SGLang's host-RAM profile asks for (0.05 is refused). float32
# because the stand-in kernels compute in float32 and tiny test models are saved so.
CPU_SERVER_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "intel_amx",
    "--sampling-backend", "pytorch",
    "--dtype", "float32",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "8192",
    "--max-running-requests", "16",
    # An idle scheduler otherwise spins through its idle checks at ~80% of a core;
    # module-scoped servers sit idle through other tests on a two-core CI machine.
    "--sleep-on-idle",
)  # fmt: skip

CPU_SERVER_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1"}


def launch_server(
    model_path: str | os.PathLike[str],
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> Server:
    """Start a CPU SGLang server on ``model_path``; ``extra_args`` follow the CPU
    flags (later flags win). Raises RuntimeError with the log tail on failure."""
    return launch(
        model_path,
        (*CPU_SERVER_FLAGS, *extra_args),
        env={**CPU_SERVER_ENV, **(env or {})},
        timeout=timeout,
    )


def generate(
    base_url: str,
    prompts_or_input_ids: Sequence[str | Sequence[int]],
    sampling_params: Mapping[str, Any],
    timeout: float = 600.0,
    extra: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """POST every prompt (text or token ids) to ``/generate`` concurrently, so the
    server batches them; responses in input order. ``extra``: more request fields
    (e.g. return_logprob)."""

    def one(prompt: str | Sequence[int]) -> dict[str, Any]:
        payload: dict[str, Any] = (
            {"text": prompt} if isinstance(prompt, str) else {"input_ids": list(prompt)}
        )
        payload["sampling_params"] = dict(sampling_params)
        payload.update(extra or {})
        response = requests.post(f"{base_url}/generate", json=payload, timeout=timeout)
        response.raise_for_status()
        return response.json()

    if not prompts_or_input_ids:
        return []
    with ThreadPoolExecutor(max_workers=len(prompts_or_input_ids)) as pool:
        return list(pool.map(one, prompts_or_input_ids))


def generate_each(
    base_url: str, prompts: Sequence[str | Sequence[int]], params: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Prompt i as a request of its own with sampling parameters ``params[i]``, all at
    once (the server batches them); responses in input order."""
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        futures = [pool.submit(generate, base_url, [p], q) for p, q in zip(prompts, params, strict=True)]
        return [f.result()[0] for f in futures]


def used_kv_tokens(base_url: str) -> int:
    """KV slots a server holds for requests (its radix cache flushed first)."""
    requests.post(base_url + "/flush_cache", timeout=60)
    loads = requests.get(base_url + "/v1/loads", timeout=60).json()
    return sum(r["num_used_tokens"] for r in loads["loads"])


def abort_streams_and_wait_for_free_kv(base_url: str, text: str, streams: int = 3, timeout: float = 60.0) -> None:
    """Start ``streams`` long greedy streaming requests, close each connection after a
    few chunks (SGLang aborts the request mid-generation), then wait until the server
    holds no KV slot; AssertionError if some are still held after ``timeout`` s."""

    def stream_then_disconnect() -> None:
        payload = {
            "text": text,
            "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
        with requests.post(base_url + "/generate", json=payload, stream=True, timeout=120) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 5:
                    break  # closing the connection aborts the request mid-generation

    with ThreadPoolExecutor(max_workers=streams) as pool:
        for future in [pool.submit(stream_then_disconnect) for _ in range(streams)]:
            future.result()
    deadline = time.monotonic() + timeout
    while (used := used_kv_tokens(base_url)) != 0:
        assert time.monotonic() < deadline, f"{used} KV slots still held after abort"
        time.sleep(0.5)
