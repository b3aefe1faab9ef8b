"""Per-step host cost of each way of serving: closed-loop decode rate and a scheduler profile.

    python scripts/profile_host.py --target TARGET --draft DRAFT --out DIR \\
        [--contenders no-spec no-spec-sync faser-k0 faser standalone-k1] \\
        [--concurrency 64 128] [--max-new-tokens 1500] [--server-args "..."]

With a tiny target the GPU finishes a decode step in well under a millisecond, so the
time a step takes is what the host spends on it: the scheduler (batch preparation,
result processing), the speculative worker's Python and the launches. Each contender
is served in turn; for each concurrency C it is sent C requests at once that decode
--max-new-tokens tokens with ignore_eos, and the decode rate is read from the server's
own "Decode batch" log lines while exactly C requests run (the streaming client is
too slow to time 128 requests' tokens itself): ``ms/token`` = 1000 x C / (tokens/s),
the time per decode step when every step emits one token per request.

Contenders: the A/B benchmark's names (no-spec, standalone-k<K>, ngram, faser) plus
``no-spec-sync`` (no-spec with --disable-overlap-schedule: SGLang's synchronous loop),
``faser-k0`` (FASER whose policy never drafts: every step is a plain decode through the
FASER worker, so its gap to no-spec is the worker's own overhead on the overlap
schedule), ``faser-k0-sync`` (the same on the synchronous loop, against no-spec-sync) and ``faser-k<K>`` (policy ``fixed``: every request drafts K tokens every
step, the drafting path; its rate counts accepted tokens). With py-spy on PATH, the scheduler process of each contender is sampled for
--pyspy-seconds at the largest concurrency, and DIR/<contender>.md lists the functions
that hold the most samples (inclusive and self).

Writes DIR/host.json and DIR/host.md (ms/token per contender and concurrency, and the
ratio to no-spec).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import psutil

from faser_sglang.bench import servers
from faser_sglang.bench.client import replay
from faser_sglang.bench.quick import Prompt

PROMPT = "def fibonacci(n):\n    "


def decode_rate(log: str, running: int) -> Optional[float]:
    """Median generation throughput (tokens/s) of the server's "Decode batch" log lines
    logged while exactly ``running`` requests decoded; None if there are none. The
    median, because a line's rate covers the time since the previous line, and the
    first line of a run also covers the idle time before it."""
    rates = [line.throughput for line in servers.decode_log_lines(log) if line.running == running]
    return statistics.median(rates) if rates else None


def scheduler_pid(server: servers.Server) -> Optional[int]:
    for child in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if "scheduler" in child.name() or "scheduler" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def record_pyspy(pid: int, seconds: float, delay: float, path: Path) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        subprocess.run(
            ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
             "--nonblocking", "--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        )  # fmt: skip

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# The scheduler loop between requests (no batch to run): not part of a step's cost.
IDLE_FRAMES = ("Scheduler.on_idle", "Scheduler.maybe_sleep_on_idle")


def summarize_pyspy(raw: Path, top: int = 40) -> str:
    """Markdown: the busy scheduler loop's functions by inclusive and by self samples."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "event_loop" not in stack or any(idle in stack for idle in IDLE_FRAMES):
            continue  # watchdog / monitor threads; the loop waiting for work
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    lines = [f"{total} samples of the busy scheduler loop\n", "| inclusive | function |", "| --- | --- |"]
    # Frames on every sampled stack (process bootstrap, the loop itself) say nothing.
    ranked = [(name, n) for name, n in inclusive.most_common() if n < total][:top]
    lines += [f"| {100 * n / total:.1f}% | `{name}` |" for name, n in ranked]
    lines += ["", "| self | function |", "| --- | --- |"]
    lines += [f"| {100 * n / total:.1f}% | `{name}` |" for name, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def _frame_name(frame: str) -> str:
    # "func (path/to/site-packages/pkg/mod.py:123)" -> "func (pkg/mod.py)"
    frame = re.sub(r":\d+\)$", ")", frame)
    return re.sub(r"\(.*?(site-packages|faser_sglang)/", lambda m: "(" + ("faser_sglang/" if m.group(1) == "faser_sglang" else ""), frame)


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    pyspy = shutil.which("py-spy")
    results: dict[str, dict[str, float]] = {}
    for name in args.contenders:
        c = servers.steady_contender(name, args.draft, args.k_max, args.out, greedy=True)  # SAMPLING is greedy
        results[name] = {}
        with servers.launch(args.target, (*shlex.split(args.server_args), *c.args), env=c.env, log_dir=args.out) as server:
            replay(server.base_url, [Prompt(PROMPT, 32)] * 4, [0.0] * 4, SAMPLING)  # warm-up
            for conc in args.concurrency:
                profile = None
                if pyspy and conc == max(args.concurrency):
                    pid = scheduler_pid(server)
                    if pid is not None:
                        profile = args.out / f"{name}.pyspy.txt"
                        thread = record_pyspy(pid, args.pyspy_seconds, args.pyspy_delay, profile)
                reqs = [Prompt(PROMPT, args.max_new_tokens)] * conc
                logged = len(server.log_path.read_text(errors="replace"))
                result = replay(server.base_url, reqs, [0.0] * conc, SAMPLING)
                errors = [t.error for t in result.timings if t.error]
                if errors:
                    raise RuntimeError(f"{name} at concurrency {conc}: {errors[0]}")
                rate = decode_rate(server.log_path.read_text(errors="replace")[logged:], conc)
                if rate is None:
                    raise RuntimeError(f"{name}: no decode log line with {conc} running requests")
                results[name][str(conc)] = 1000 * conc / rate
                print(f"{name:16s} C={conc:4d}  {rate:9.0f} tok/s  {results[name][str(conc)]:.2f} ms/token", flush=True)
                if profile is not None:
                    thread.join()
                    if profile.exists():
                        (args.out / f"{name}.md").write_text(f"# {name}, concurrency {conc}\n\n" + summarize_pyspy(profile))
    report = {"concurrency": args.concurrency, "ms_per_token": results, "command": args.command}
    (args.out / "host.json").write_text(json.dumps(report, indent=2))
    (args.out / "host.md").write_text(markdown(results, args.concurrency))
    return report


SAMPLING = {"temperature": 0.0, "ignore_eos": True}


def markdown(results: dict[str, dict[str, float]], concurrency: Sequence[int]) -> str:
    base = results.get("no-spec")
    head = "| contender | " + " | ".join(f"ms/token C={c}" for c in concurrency) + " |"
    lines = [head, "| --- |" + " --- |" * len(concurrency)]
    for name, row in results.items():
        cells = []
        for c in concurrency:
            v = row.get(str(c))
            ratio = f" ({v / base[str(c)]:.2f}x)" if base and v and str(c) in base else ""
            cells.append(f"{v:.2f}{ratio}" if v else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--contenders", nargs="+", default=["no-spec", "no-spec-sync", "faser-k0", "faser", "standalone-k1"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 128])
    p.add_argument("--max-new-tokens", type=int, default=1500)
    p.add_argument("--k-max", type=int, default=4)
    p.add_argument("--pyspy-seconds", type=float, default=4.0)
    p.add_argument("--pyspy-delay", type=float, default=2.0, help="seconds after the requests are sent")
    p.add_argument("--server-args", default="")
    args = p.parse_args(argv)
    args.command = " ".join(["python scripts/profile_host.py", *(argv if argv is not None else sys.argv[1:])])
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
