"""Where a scheduler's loop iterations spend their time, from FASER_SCHED_TIMELINE files.

    python scripts/sched_timeline.py DIR|sched-<pid>.jsonl [...] [--from S] [--to S]

Reads the timelines that ``faser_sglang.sched_timeline`` writes. An iteration runs
from one ``get_next_batch_to_run`` call to the next, and its kind is the mode of the
batch that call picked; idle iterations are left out. The hooked calls made in the
iteration are summed:
- picking the batch;
- launching it (``run_batch``, which holds ``resolve_seq_lens_cpu``'s wait);
- processing a result: the previous batch's on the overlap schedule, its wait for the
  GPU included.

The rest ("other") is the loop's remaining work: receiving requests and the loop
itself. ``--from`` / ``--to`` keep the iterations that start in that window, in seconds
from the server's first busy iteration. Prints one markdown table over all files, one
row per server and iteration kind, in ms per iteration.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CALLS = ("get_next_batch_to_run", "run_batch", "resolve_seq_lens_cpu", "process_batch_result")


@dataclass
class Timeline:
    name: str
    records: list[dict]


@dataclass
class KindStats:
    iteration_ms: list[float] = field(default_factory=list)
    call_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def server_name(header: dict) -> str:
    algorithm = header.get("speculative_algorithm")
    if not algorithm:
        return f"no-spec ({header['pid']})"
    return f"{algorithm.lower()} k{header.get('speculative_num_steps')} ({header['pid']})"


def load(path: Path) -> Timeline:
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a server was stopped in the middle of
    header = next((r for r in lines if r.get("header")), {"pid": path.stem})
    return Timeline(server_name(header), [r for r in lines if not r.get("header")])


def iteration_stats(records: list[dict], start: float = 0.0, end: float = float("inf")) -> dict[str, KindStats]:
    """Per iteration kind: each iteration's length and the hooked calls' ms summed over
    the kind's iterations (the last iteration, which has no end, left out)."""
    picks = [r for r in records if r["fn"] == "get_next_batch_to_run"]
    busy = [r["t"] for r in picks if r["mode"] != "idle"]
    if not busy:
        return {}
    origin = busy[0]
    calls = sorted((r for r in records if r["fn"] != "get_next_batch_to_run"), key=lambda r: r["t"])
    stats: dict[str, KindStats] = defaultdict(KindStats)
    j = 0
    for pick, following in zip(picks, picks[1:]):
        while j < len(calls) and calls[j]["t"] < pick["t"]:
            j += 1
        if pick["mode"] == "idle" or not start <= pick["t"] - origin < end:
            continue
        kind = stats[pick["mode"]]
        kind.iteration_ms.append(1e3 * (following["t"] - pick["t"]))
        kind.call_ms["get_next_batch_to_run"] += pick["ms"]
        k = j
        while k < len(calls) and calls[k]["t"] < following["t"]:
            kind.call_ms[calls[k]["fn"]] += calls[k]["ms"]
            k += 1
    return dict(stats)


def table(timelines: list[Timeline], start: float = 0.0, end: float = float("inf")) -> str:
    rows = [
        "| server | iteration | count | ms mean | ms p50 | pick | launch | (resolve wait) | result | other |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for timeline in timelines:
        for mode, kind in sorted(iteration_stats(timeline.records, start, end).items()):
            n = len(kind.iteration_ms)
            mean = statistics.fmean(kind.iteration_ms)
            per = {fn: kind.call_ms[fn] / n for fn in CALLS}
            # resolve_seq_lens_cpu runs inside run_batch: not counted twice in "other".
            other = mean - per["get_next_batch_to_run"] - per["run_batch"] - per["process_batch_result"]
            rows.append(
                f"| {timeline.name} | {mode} | {n} | {mean:.2f} | {statistics.median(kind.iteration_ms):.2f} "
                f"| {per['get_next_batch_to_run']:.2f} | {per['run_batch']:.2f} | {per['resolve_seq_lens_cpu']:.2f} "
                f"| {per['process_batch_result']:.2f} | {other:.2f} |"
            )
    return "\n".join(rows)


def files(paths: list[Path]) -> list[Path]:
    out = []
    for path in paths:
        out.extend(sorted(path.glob("sched-*.jsonl")) if path.is_dir() else [path])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--from", dest="start", type=float, default=0.0, help="seconds from the first busy iteration")
    parser.add_argument("--to", dest="end", type=float, default=float("inf"))
    args = parser.parse_args()
    print(table([load(p) for p in files(args.paths)], args.start, args.end))
