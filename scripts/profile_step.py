"""Where a FASER decode step's time goes: torch-profiler traces at a steady batch.

    python scripts/profile_step.py --target TARGET --draft DRAFT --out DIR \\
        [--contenders faser-k3 faser-k3@draft_chain=false faser-ad] [--faser-ad-config F] \\
        [--concurrency 1 4 8] [--steps 40] [--activities CPU GPU] [--temperature 0.8] \\
        [--server-args "..."]

Each contender (scripts/profile_host.py's names: ``faser-k<K>[@KEY=VALUE,...]`` drafts K
tokens every step, ``faser-ad[@...]`` runs the adaptive policy of --faser-ad-config) is
served once. For each concurrency C it is sent C requests that decode
--max-new-tokens tokens with ignore_eos, greedy or, with --temperature, sampled (with
top-p 0.95); once all C run, SGLang's ``/start_profile`` records --steps scheduler
steps with torch.profiler (no Python stacks, no shapes, so
the profiler adds little to the host's time), then the requests are aborted. The
trace is summarised per step kind, batch size and FASER phase
(``faser_sglang/bench/step_profile.py`` says what each column measures): how long the
host spends in each phase, how much of it waiting on the device, what it launches and
how long the device works on it.

The profiler slows the host (each op and each graph launch is recorded), so before it
starts, the batch's step period is also read without it from SGLang's own decode log
(``unprofiled_period_ms``: the log line that closes the first whole --decode-log-interval
steps at the batch size, ``accept len`` tokens per request and step, 1 without
speculation, times C over its generation throughput).

Writes DIR/<contender>-c<C>.trace.json.gz (open in Perfetto or chrome://tracing),
DIR/steps.json and DIR/steps.md (rewritten after every batch, so a run cut short
keeps the batches it finished; ``python -m faser_sglang.bench.step_profile TRACE...``
summarises traces alone).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import requests
from tqdm import tqdm

from faser_sglang.bench import health, servers, step_profile
from faser_sglang.bench.ab import sampling_params
from faser_sglang.bench.client import replay
from faser_sglang.bench.quick import Prompt

PROMPT = "def fibonacci(n):\n    "
TOP_P = 0.95  # of sampled requests
UNPROFILED_TIMEOUT = 60.0  # s for two decode log lines (SGLang logs one per 40 steps by default)


def wait_for_batch(base_url: str, size: int, timeout: float) -> None:
    """Until exactly ``size`` requests run and none waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = health.load(base_url)
        if load.running == size and load.waiting == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not reach a batch of {size} running requests in {timeout:.0f} s")


def unprofiled_period_ms(log_path: Path, size: int, timeout: float) -> Optional[float]:
    """The step period of a steady batch of ``size`` requests from SGLang's decode log,
    read from the log's current end on (module docstring); None if no whole interval
    at that batch size is logged within ``timeout`` s. The first line at the batch size
    closes an interval that began before this call, so the second one is read."""
    start = log_path.stat().st_size
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with log_path.open(errors="replace") as log:
            log.seek(start)
            lines = [line for line in servers.decode_log_lines(log.read()) if line.running == size]
        if len(lines) >= 2:
            line = lines[1]
            tokens_per_step = size * (line.accept_len or 1.0)
            return 1000.0 * tokens_per_step / line.throughput if line.throughput > 0 else None
        time.sleep(0.2)
    return None


def wait_for_trace(path: Path, timeout: float) -> list[dict[str, Any]]:
    """The trace's events once the server has written the whole file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return step_profile.load_events(path)
            except (EOFError, OSError, json.JSONDecodeError, gzip.BadGzipFile):
                pass  # still being written
        time.sleep(0.5)
    raise RuntimeError(f"no complete profiler trace at {path} after {timeout:.0f} s")


def profile_once(
    server: servers.Server, name: str, size: int, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], Optional[float]]:
    """Profile --steps steps of a batch of ``size`` requests: the trace's groups, and the
    batch's step period before the profile (``unprofiled_period_ms``)."""
    reqs = [Prompt(PROMPT, args.max_new_tokens)] * size
    sender = threading.Thread(target=replay, args=(server.base_url, reqs, [0.0] * size, args.sampling), daemon=True)
    sender.start()
    try:
        wait_for_batch(server.base_url, size, args.timeout)
        time.sleep(args.settle)
        unprofiled = unprofiled_period_ms(server.log_path, size, min(args.timeout, UNPROFILED_TIMEOUT))
        profile_id = f"{name}-c{size}"
        trace = args.out / f"{profile_id}-TP-0.trace.json.gz"
        trace.unlink(missing_ok=True)  # an earlier run's would be read as this one's
        r = requests.post(
            f"{server.base_url}/start_profile",
            json={
                "output_dir": str(args.out.resolve()),
                "num_steps": args.steps,
                "activities": args.activities,
                "with_stack": args.with_stack,
                "record_shapes": False,
                "profile_id": profile_id,
            },
            timeout=60,
        )
        if r.status_code != 200:
            raise RuntimeError(f"/start_profile answered {r.status_code}: {r.text[:500]}")
        events = wait_for_trace(trace, args.timeout)
    finally:
        try:
            requests.post(f"{server.base_url}/abort_request", json={"abort_all": True}, timeout=60)
        except requests.RequestException as e:  # a dead server: the error that killed it says more
            print(f"{name}: could not abort the requests ({e})", file=sys.stderr)
        sender.join(timeout=args.timeout)
    left = health.wait_until_drained(server.base_url)
    if not left.idle or left.used_tokens:
        raise RuntimeError(f"{name}: after the abort the server still holds {left}")
    return step_profile.summarize(step_profile.steps(step_profile.parse(events))), unprofiled


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    unprofiled: dict[str, dict[str, Optional[float]]] = {}
    md = [f"# Decode steps by phase\n\n`{args.command}`\n"]
    plan = [(name, size) for name in args.contenders for size in args.concurrency]
    bar = tqdm(total=len(plan), desc="profiling", unit="batch")
    for name in args.contenders:
        c = servers.steady_contender(
            name, args.draft, args.k_max, args.out, args.faser_ad_config, greedy=args.temperature == 0
        )
        results[name], unprofiled[name] = {}, {}
        server_args = (*shlex.split(args.server_args), *c.args)
        with servers.launch(args.target, server_args, env=c.env, log_dir=args.out) as server:
            replay(server.base_url, [Prompt(PROMPT, 32)] * 4, [0.0] * 4, args.sampling)  # warm-up
            for size in args.concurrency:
                groups, period = profile_once(server, name, size, args)
                results[name][str(size)], unprofiled[name][str(size)] = groups, period
                md.append(step_profile.markdown(groups, title=f"{name}, {size} requests"))
                md.append(f"unprofiled step period (SGLang's decode log, before the profile): {_ms(period)}\n")
                # After every batch: a run cut short keeps what it measured.
                report = write(args, results, unprofiled, md)
                bar.update()
    bar.close()
    print("\n".join(md))
    return report


def write(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    unprofiled: dict[str, dict[str, Optional[float]]],
    md: list[str],
) -> dict[str, Any]:
    report = {"command": args.command, "steps": args.steps, "profiles": results, "unprofiled_period_ms": unprofiled}
    (args.out / "steps.json").write_text(json.dumps(report, indent=1))
    (args.out / "steps.md").write_text("\n".join(md))
    return report


def _ms(value: Optional[float]) -> str:
    return "not logged" if value is None else f"{value:.2f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--contenders", nargs="+", default=["faser-k3", "faser-k3@draft_chain=false"])
    p.add_argument("--faser-ad-config", help="FASER config (policy adaptive) for faser-ad contenders")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--steps", type=int, default=40, help="scheduler steps to record per batch")
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--k-max", type=int, default=4)
    p.add_argument("--activities", nargs="+", default=["CPU", "GPU"], choices=["CPU", "GPU"])
    p.add_argument(
        "--with-stack", action="store_true", help="record Python stacks too (the trace names what called each op)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled requests (top-p 0.95)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds of decoding before the profile starts")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--server-args", default="")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (a step's period ends at the next step)")
    if min(args.concurrency) < 1:
        p.error("--concurrency values must be >= 1")
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    args.sampling = sampling_params(args.temperature, TOP_P)
    if "CPU" not in args.activities:
        p.error("--activities must include CPU: FASER's step and phase ranges are CPU events")
    args.command = " ".join(["python scripts/profile_step.py", *(argv if argv is not None else sys.argv[1:])])
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
