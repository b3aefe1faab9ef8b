"""Soak: one FASER server under a long bursty trace with aborts and mixed sampling.

    python -m faser_sglang.bench.soak --target T --draft D --out DIR \
        [--duration 480] [--rate 6] [--peak-to-valley 10] [--abort-fraction 0.1] \
        [--k-max 5] [--faser-config F] [--seed 0] [--server-args ...]

Every request draws its own sampling parameters (half greedy; the rest temperature,
top_p, top_k, some with n=2), output length and stop conditions. About
``--abort-fraction`` of them are abandoned mid-generation: half by closing the
streaming connection after a few chunks (SGLang aborts on disconnect), half by
``/abort_request`` with the request's rid. A few of the trace's requests warm the
server up before the clock starts (first-use kernel compilation is not a latency the
soak is after). The server's process and load are watched throughout. At the end the
load must drain and every KV slot come back (target and draft share one allocator, so
``/v1/loads`` sees a slot leaked by either).

Outputs in ``--out``: soak.json (every request, per-minute percentiles, the verdict),
soak.md (the per-minute table) and soak.png (latency percentiles and throughput per
minute). Exit status 0 only with no crash, no leak, no stuck request and no failed
request that was not deliberately aborted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import requests
from tqdm import tqdm

from faser_sglang.bench import servers, traces, workloads
from faser_sglang.bench.health import load, wait_until_drained

MINUTE = 60.0


@dataclass(frozen=True)
class Plan:
    """What one request sends and how (if at all) it is abandoned."""

    index: int
    arrival: float
    rid: str
    payload: dict[str, Any]
    abort: Optional[str]  # None, "disconnect" or "abort_request"
    abort_after_chunks: int


@dataclass
class Outcome:
    index: int
    arrival: float
    abort: Optional[str]
    status: str = "pending"  # ok | aborted | error
    e2e: Optional[float] = None
    ttft: Optional[float] = None
    output_tokens: int = 0
    error: Optional[str] = None


def plan_requests(trace: traces.Trace, pool: Sequence[workloads.Request], abort_fraction: float, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for i, arrival in enumerate(trace.arrivals):
        req = pool[i % len(pool)]
        params: dict[str, Any] = {"max_new_tokens": rng.choice([1, 8, 32, 64, 128, 256])}
        if rng.random() < 0.5:
            params["temperature"] = 0
        else:
            params.update(
                temperature=round(rng.uniform(0.3, 1.3), 2),
                top_p=round(rng.uniform(0.7, 1.0), 2),
                top_k=rng.choice([-1, 5, 50]),
            )
        if rng.random() < 0.5:
            params["ignore_eos"] = True
        if rng.random() < 0.2:
            params["stop"] = [rng.choice(["\n\n", "return", ")"])]
        payload: dict[str, Any] = {"text": req.prompt, "sampling_params": params, "stream": True}
        if params.get("temperature", 0) > 0 and rng.random() < 0.2:
            params["n"] = 2
        if rng.random() < 0.1:
            payload.update(return_logprob=True, top_logprobs_num=2)
        abort = None
        if rng.random() < abort_fraction:
            abort = rng.choice(["disconnect", "abort_request"])
            params["max_new_tokens"] = max(params["max_new_tokens"], 64)
        rid = uuid.UUID(int=rng.getrandbits(128)).hex
        if params.get("n", 1) == 1:
            payload["rid"] = rid
        elif abort == "abort_request":
            abort = "disconnect"  # an n > 1 request has one rid per sample; disconnect aborts them all
        plans.append(Plan(i, arrival, rid, payload, abort, rng.randint(1, 6)))
    return plans


def warm_up(base_url: str, plans: Sequence[Plan], count: int = 8) -> None:
    """Serve a few of the trace's requests (no aborts, fresh rids) before the clock
    starts, so kernel compilation and first-use allocations on a fresh server do not
    show up as the first minute's latency. Failures here count like any other."""
    warm = []
    for plan in plans[:count]:
        payload = dict(plan.payload)
        if "rid" in payload:
            payload["rid"] = uuid.uuid4().hex
        warm.append(replace(plan, arrival=0.0, rid=payload.get("rid", ""), payload=payload, abort=None))
    with ThreadPoolExecutor(max_workers=max(1, len(warm))) as pool_ex:
        outcomes = list(pool_ex.map(lambda plan: run_one(base_url, plan, time.monotonic()), warm))
    failed = [o for o in outcomes if o.status != "ok"]
    if failed:
        raise RuntimeError(f"soak warm-up: {len(failed)} of {len(warm)} requests failed, e.g. {failed[0].error}")


def run_one(base_url: str, plan: Plan, start: float) -> Outcome:
    out = Outcome(plan.index, plan.arrival, plan.abort)
    delay = start + plan.arrival - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    sent = time.monotonic()
    chunks = 0
    abort_sent = False
    try:
        with requests.post(base_url + "/generate", json=plan.payload, stream=True, timeout=900) as r:
            if r.status_code != 200:
                out.status, out.error = "error", f"HTTP {r.status_code}: {r.text[:200]}"
                return out
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[len(b"data: ") :])
                chunks += 1
                if out.ttft is None:
                    out.ttft = time.monotonic() - sent
                out.output_tokens = int(chunk.get("meta_info", {}).get("completion_tokens", out.output_tokens))
                if plan.abort and chunks == plan.abort_after_chunks:
                    if plan.abort == "disconnect":
                        out.status = "aborted"  # leaving the with-block closes the socket
                        return out
                    requests.post(base_url + "/abort_request", json={"rid": plan.rid}, timeout=60)
                    abort_sent = True  # the stream then ends with the abort's finish reason
        out.e2e = time.monotonic() - sent
        out.status = "aborted" if abort_sent else "ok"
    except (requests.RequestException, ValueError) as e:
        out.status, out.error = ("aborted" if abort_sent else "error"), f"{type(e).__name__}: {e}"
    return out


def per_minute(outcomes: Sequence[Outcome], duration: float) -> list[dict[str, Any]]:
    """Completed/aborted/failed counts, tokens and latency percentiles of the requests
    that arrived in each minute."""
    pct = lambda xs, q: round(float(np.percentile(xs, q)), 3) if xs else None  # noqa: E731
    rows = []
    for m in range(int(np.ceil(duration / MINUTE))):
        arrived = [o for o in outcomes if m * MINUTE <= o.arrival < (m + 1) * MINUTE]
        done = [o for o in arrived if o.status == "ok"]
        e2e = [o.e2e for o in done if o.e2e is not None]
        ttft = [o.ttft for o in done if o.ttft is not None]
        rows.append(
            {
                "minute": m + 1,
                "completed": len(done),
                "aborted": sum(o.status == "aborted" for o in arrived),
                "errors": sum(o.status == "error" for o in arrived),
                "output_tokens": sum(o.output_tokens for o in done),
                "e2e_p50": pct(e2e, 50), "e2e_p90": pct(e2e, 90), "e2e_p99": pct(e2e, 99),
                "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            }
        )  # fmt: skip
    return rows


def _numpy_scalar(x: Any) -> Any:
    return x.item()


def markdown(rows: Sequence[dict[str, Any]], verdict: dict[str, Any]) -> str:
    cols = ["minute", "completed", "aborted", "errors", "output_tokens", "e2e_p50", "e2e_p90", "e2e_p99", "ttft_p50", "ttft_p99"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", "verdict: " + json.dumps(verdict, default=_numpy_scalar)]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for key in ("e2e_p50", "e2e_p90", "e2e_p99"):
        a.plot(minutes, [r[key] for r in rows], marker="o", label=key)
    a.set_ylabel("E2E latency (s)")
    a.legend()
    b.bar(minutes, [r["output_tokens"] / MINUTE for r in rows], color="tab:green")
    b.set_ylabel("output tokens/s (completed)")
    b.set_xlabel("minute of the soak (by arrival)")
    fig.suptitle("FASER soak: latency percentiles and throughput per minute")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def watch(server: servers.Server, stop: threading.Event, seen: dict[str, Any]) -> None:
    """Record peak load and whether the server process died."""
    while not stop.wait(1.0):
        if server.process.poll() is not None:
            seen["crashed"] = True
            return
        try:
            now = load(server.base_url)
            seen["peak_running"] = max(seen["peak_running"], now.running)
            seen["peak_waiting"] = max(seen["peak_waiting"], now.waiting)
        except requests.RequestException:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--duration", type=float, default=480.0)
    p.add_argument("--rate", type=float, default=6.0, help="mean requests/s")
    p.add_argument("--peak-to-valley", type=float, default=10.0)
    p.add_argument("--burst-min", type=float, default=5.0)
    p.add_argument("--burst-max", type=float, default=60.0)
    p.add_argument("--abort-fraction", type=float, default=0.1)
    p.add_argument("--k-max", type=int, default=5)
    p.add_argument("--faser-config")
    p.add_argument("--workload", choices=["humaneval", "sharegpt", "long"], default="humaneval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[])
    args = p.parse_args(argv)
    if not 0 <= args.abort_fraction <= 1:
        p.error("--abort-fraction must be in [0, 1]")
    args.out.mkdir(parents=True, exist_ok=True)

    trace = traces.bursty(args.rate, args.peak_to_valley, args.duration, seed=args.seed,
                          burst_seconds=(args.burst_min, args.burst_max))  # fmt: skip
    pool = workloads.load(args.workload, None if args.workload == "humaneval" else 200, seed=args.seed)
    plans = plan_requests(trace, pool, args.abort_fraction, args.seed)
    contender = servers.faser(args.draft, args.k_max, args.faser_config)
    with servers.launch(args.target, (*args.server_args, *contender.args), env=contender.env, timeout=1200) as server:
        warm_up(server.base_url, plans)
        start_load = wait_until_drained(server.base_url)
        seen: dict[str, Any] = {"crashed": False, "peak_running": 0, "peak_waiting": 0}
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(server, stop, seen), daemon=True)
        watcher.start()
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=512) as pool_ex, tqdm(total=len(plans), desc="soak", unit="req") as bar:
            futures = [pool_ex.submit(run_one, server.base_url, plan, start) for plan in plans]
            outcomes = []
            for f in futures:
                outcomes.append(f.result())
                bar.update()
        stop.set()
        watcher.join(timeout=5)
        crashed = seen["crashed"] or server.process.poll() is not None
        final = None if crashed else wait_until_drained(server.base_url, timeout=180)
        healthy = not crashed and requests.get(server.base_url + "/health", timeout=30).status_code == 200

    rows = per_minute(outcomes, args.duration)
    verdict = {
        "requests": len(outcomes),
        "ok": sum(o.status == "ok" for o in outcomes),
        "aborted": sum(o.status == "aborted" for o in outcomes),
        "unexpected_errors": sum(o.status == "error" and o.abort is None for o in outcomes),
        "crashed": crashed,
        "healthy_after": healthy,
        "used_tokens_before": start_load.used_tokens,
        "used_tokens_after": None if final is None else final.used_tokens,
        "stuck_after": None if final is None else final.running + final.waiting,
        "peak_running": seen["peak_running"],
        "peak_waiting": seen["peak_waiting"],
        "wall_seconds": round(time.monotonic() - start, 1),
    }
    verdict["passed"] = bool(
        not crashed and healthy and verdict["unexpected_errors"] == 0
        and verdict["used_tokens_after"] == start_load.used_tokens and verdict["stuck_after"] == 0
    )  # fmt: skip
    (args.out / "soak.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "verdict": verdict, "per_minute": rows,
         "requests": [asdict(o) for o in outcomes]}, indent=1, default=_numpy_scalar))  # fmt: skip
    (args.out / "soak.md").write_text(markdown(rows, verdict))
    plot(rows, args.out / "soak.png")
    print(markdown(rows, verdict))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
