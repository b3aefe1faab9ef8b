"""Helpers shared by the fuzzing and reliability tests: FASER launcher flags,
servers started together, and checks that a response obeys its request."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from faser_sglang.bench.servers import Server

# Generous per-request HTTP timeout: CPU servers shared with other jobs can be slow.
HTTP_TIMEOUT = 600.0


def faser_flags(draft: str | Path, k_max: int) -> tuple[str, ...]:
    """Launcher flags that select FASER with ``draft`` and K_max = ``k_max``."""
    return (
        "--speculative-algorithm", "FASER",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(k_max),
    )  # fmt: skip


@contextmanager
def servers_together(*launches: Callable[[], Server]) -> Iterator[list[Server]]:
    """Start several servers at once (their startups overlap) and close them all on
    exit; if one fails to start, the others are closed and the error propagates."""
    with ThreadPoolExecutor(max_workers=len(launches)) as pool:
        futures = [pool.submit(launch) for launch in launches]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        for f in futures:
            f.result()
        yield started
    finally:
        for server in started:
            server.close()


def vocab_size(model_path: str | Path) -> int:
    """The model's vocabulary size, from its ``config.json``."""
    return int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])


def post_generate(base_url: str, payload: Mapping[str, Any], timeout: float = HTTP_TIMEOUT) -> requests.Response:
    """POST one JSON request to the native ``/generate`` endpoint."""
    return requests.post(f"{base_url}/generate", json=dict(payload), timeout=timeout)


def outputs_of(body: Any) -> list[dict[str, Any]]:
    """The list of completions in a ``/generate`` answer (a dict when n == 1)."""
    return body if isinstance(body, list) else [body]


def well_formed_problems(
    params: Mapping[str, Any],
    out: Mapping[str, Any],
    vocab_size: int,
    eos_ids: Sequence[int],
    decode: Any,
) -> list[str]:
    """Ways one completion breaks its request's rules (empty list: none).

    Mirrors SGLang's finish rules: ``max_new_tokens`` caps the length; unless
    ``ignore_eos``, a stop token id (or EOS) ends the output right after it; a stop
    string ends it at the token that completes it (and is trimmed from the text).
    ``decode`` turns token ids into text the way SGLang's stop check does.
    """
    ids: list[int] = out["output_ids"]
    reason = out["meta_info"]["finish_reason"] or {}
    max_new = params["max_new_tokens"]
    stop_ids = set() if params.get("ignore_eos") else {*params.get("stop_token_ids", ()), *eos_ids}
    stops: list[str] = list(params.get("stop", ()))
    problems = []
    if any(not 0 <= t < vocab_size for t in ids):
        problems.append(f"token id outside [0, {vocab_size})")
    if len(ids) > max_new:
        problems.append(f"{len(ids)} tokens > max_new_tokens {max_new}")
    if any(t in stop_ids for t in ids[:-1]):
        problems.append("a stop token id before the last token")
    early = [s for s in stops if s in decode(ids[:-1])]
    if early:
        problems.append(f"stop string(s) {early} complete before the last token")
    kind = reason.get("type")
    if kind == "length":
        if len(ids) != max_new:
            problems.append(f"finish 'length' after {len(ids)} of {max_new} tokens")
    elif kind == "stop":
        matched = reason.get("matched")
        if isinstance(matched, int):
            if matched not in stop_ids or not ids or ids[-1] != matched:
                problems.append(f"finish on token {matched} that is not a live stop id at the end")
        elif matched not in stops:
            problems.append(f"finish on string {matched!r} that is not a stop string")
        elif matched in out["text"]:
            problems.append(f"stop string {matched!r} not trimmed from the text")
    else:
        problems.append(f"unexpected finish reason {reason}")
    problems += logprob_problems(out, ids)
    return problems


def logprob_problems(out: Mapping[str, Any], ids: Sequence[int]) -> list[str]:
    """Output logprobs, when present, must cover each output token with a finite
    log-probability <= 0 (a tiny float slack above 0)."""
    entries = out["meta_info"].get("output_token_logprobs")
    if entries is None:
        return []
    if [e[1] for e in entries] != list(ids):
        return ["output_token_logprobs do not list the output tokens"]
    bad = [e[0] for e in entries if e[0] is None or not math.isfinite(e[0]) or e[0] > 1e-4]
    return [f"invalid output logprobs {bad[:3]}"] if bad else []


def reproducer(seed: int, index: int, payload: Mapping[str, Any], problem: str) -> str:
    """One line that names a failing fuzz case and the exact request to replay."""
    return f"seed={seed} case={index} request={json.dumps(payload, ensure_ascii=True)} :: {problem}"
