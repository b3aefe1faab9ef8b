"""Where a scheduler's loop iterations spend their time, from FASER_SCHED_TIMELINE files.

    python scripts/sched_timeline.py DIR|sched-<pid>.jsonl[.gz] [...] [--from S] [--to S] \
        [--stat median] [--by-batch 8,32,128] [--above 11.5] [--stall-ms 50]

Reads the timelines that ``faser_sglang.sched_timeline`` writes. An iteration runs
from one ``get_next_batch_to_run`` call to the next, and its kind is the mode of the
batch that call picked; idle iterations are left out. The hooked calls made in the
iteration are summed:
- picking the batch;
- launching it (``run_batch``, which holds ``resolve_seq_lens_cpu``'s wait and the
  target model's forward through SGLang's worker, "target_forward", shown apart: in a
  prefill, what a speculative server's launch spends outside it is its own work around
  the target's; FASER's verify of drafts does not go through that worker);
- processing a result: the previous batch's on the overlap schedule, its wait for the
  GPU included.

The rest ("other") is the loop's remaining work: receiving requests and the loop
itself. ``--from`` / ``--to`` keep the iterations that start in that window, in seconds
from the server's first busy iteration. Prints one markdown table over all files, one
row per server and iteration kind, in ms per iteration: means (``--stat median``:
medians, robust to a fresh server's first kernel compiles), then each server's
prefills as a line over the tokens they fed (``prefill_fits``: the intercept is a
prefill's cost whatever its length), its prefills' target forward by the iteration
before each (``prefill_after``: what a prefill waits for of the GPU work still queued)
and its CUDA allocator retries. ``--by-batch``
splits the rows by batch size (a step's cost depends on it, and servers that keep up
differently run different batches); ``--above`` splits them at an iteration time,
which on a FASER server tells its drafting steps (whose time the timeline does not
mark) from its plain ones. Then each server's batch picks slower
than ``--stall-ms`` (``pick_stalls``): one per new batch size is a first-use compile;
and, where the timeline records them, the Triton compiles each server waited for while
serving (``compiles``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from faser_sglang.sched_timeline import server_label

CALLS = ("get_next_batch_to_run", "run_batch", "resolve_seq_lens_cpu", "target_forward", "process_batch_result")


@dataclass
class Timeline:
    name: str
    records: list[dict]


COLUMNS = ("iteration", *CALLS, "other")


def split(pick: dict, calls: list[dict], end_t: float) -> dict[str, float]:
    """One iteration's ms: its length, each hooked call's ms summed, and the rest."""
    out = dict.fromkeys(COLUMNS, 0.0)
    out["iteration"] = 1e3 * (end_t - pick["t"])
    out["get_next_batch_to_run"] = pick["ms"]
    for call in calls:
        out[call["fn"]] += call["ms"]
    # resolve_seq_lens_cpu and target_forward run inside run_batch: not counted twice.
    out["other"] = out["iteration"] - out["get_next_batch_to_run"] - out["run_batch"] - out["process_batch_result"]
    return out


def server_name(header: dict) -> str:
    """"faser k7 (1234)", with its FASER_CONFIG file's stem, whether it planned prefills
    from host lengths and its prefill graphs where it has them:
    "faser k7 (1234, faser-ad, host plan, breakable prefill graphs)"."""
    label = server_label(header.get("speculative_algorithm"), header.get("speculative_num_steps"))
    config = header.get("faser_config")
    graphs = header.get("prefill_graphs")
    extras = ([Path(config).stem] if config else []) + (["host plan"] if header.get("host_prefill_plan") else [])
    extras += [f"{graphs} prefill graphs"] if graphs not in (None, "disabled") else []
    return f"{label} ({', '.join([str(header['pid']), *extras])})"


def load(path: Path) -> Timeline:
    lines = []
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a server was stopped in the middle of
    header = next((r for r in lines if r.get("header")), {"pid": path.stem})
    return Timeline(server_name(header), [r for r in lines if not r.get("header")])


def picks_and_origin(records: list[dict]) -> tuple[list[dict], Optional[float]]:
    """The batch picks, and the time of the first busy one (None: the server never ran a
    batch), from which ``--from`` / ``--to`` count."""
    picks = [r for r in records if r["fn"] == "get_next_batch_to_run"]
    return picks, next((r["t"] for r in picks if r["mode"] != "idle"), None)


def iteration_stats(
    records: list[dict], start: float = 0.0, end: float = float("inf")
) -> dict[str, list[dict[str, float]]]:
    """Per iteration kind, each iteration's ``split`` (the last iteration, which has no
    end, left out)."""
    picks, origin = picks_and_origin(records)
    if origin is None:
        return {}
    calls = sorted((r for r in records if r["fn"] in CALLS[1:]), key=lambda r: r["t"])
    stats: dict[str, list[dict[str, float]]] = defaultdict(list)
    j = 0
    for pick, following in zip(picks, picks[1:]):
        while j < len(calls) and calls[j]["t"] < pick["t"]:
            j += 1
        if pick["mode"] == "idle" or not start <= pick["t"] - origin < end:
            continue
        k = j
        while k < len(calls) and calls[k]["t"] < following["t"]:
            k += 1
        stats[pick["mode"]].append({**split(pick, calls[j:k], following["t"]), "bs": pick["bs"]})
    return dict(stats)


def groups(
    iterations: list[dict[str, float]], edges: Sequence[int], above: Optional[float]
) -> list[tuple[str, list[dict[str, float]]]]:
    """(label, iterations) per batch-size bucket (``edges``: upper bounds, e.g. 8, 32, 128;
    none: one group), each split at ``above`` ms of iteration time when given."""
    buckets: list[tuple[str, list[dict[str, float]]]] = []
    low = 1
    for edge in edges:
        buckets.append((f"{low}-{edge}", [it for it in iterations if low <= it["bs"] <= edge]))
        low = edge + 1
    if not edges:
        buckets.append(("all", iterations))
    elif any(it["bs"] >= low for it in iterations):
        buckets.append((f">={low}", [it for it in iterations if it["bs"] >= low]))
    if above is None:
        return [(label, its) for label, its in buckets if its]
    out = []
    for label, its in buckets:
        for side, part in ((f"<={above:g} ms", [it for it in its if it["iteration"] <= above]),
                           (f">{above:g} ms", [it for it in its if it["iteration"] > above])):  # fmt: skip
            if part:
                out.append((f"{label}, {side}", part))
    return out


def table(
    timelines: list[Timeline],
    start: float = 0.0,
    end: float = float("inf"),
    stat: str = "mean",
    edges: Sequence[int] = (),
    above: Optional[float] = None,
) -> str:
    """One row per server and iteration kind (and, with ``edges`` or ``above``, per batch
    size bucket and iteration-time side): each column's mean (they add up to the
    iteration) or median (robust to a fresh server's first compiles; they need not add
    up) over the kind's iterations, in ms."""
    aggregate = statistics.fmean if stat == "mean" else statistics.median
    grouped = bool(edges) or above is not None
    batch = " batch |" if grouped else ""
    rows = [
        f"| server | iteration |{batch} count | {stat} ms | pick | launch | (resolve wait) | (target forward) "
        "| result | other |",
        "|---|---|" + ("---|" if grouped else "") + "---|---|---|---|---|---|---|---|",
    ]
    for timeline in timelines:
        for mode, iterations in sorted(iteration_stats(timeline.records, start, end).items()):
            parts = groups(iterations, edges, above) if grouped else [("", iterations)]
            for label, its in parts:
                cells = " | ".join(f"{aggregate([it[c] for it in its]):.2f}" for c in COLUMNS)
                rows.append(f"| {timeline.name} | {mode} |{f' {label} |' if grouped else ''} {len(its)} | {cells} |")
    return "\n".join(rows)


def alloc_retries(timelines: list[Timeline]) -> str:
    """One line per server: the CUDA caching allocator's retries by its last idle pick,
    and the device allocations (cudaMalloc) between its first and last idle picks, where
    the timeline has them (after startup, a sign that eager forwards found no cached
    block)."""
    lines = []
    for timeline in timelines:
        idle = [r for r in timeline.records if r.get("alloc_retries") is not None]
        if not idle:
            continue
        line = f"- {timeline.name}: {idle[-1]['alloc_retries']} CUDA allocator retries by its last idle iteration"
        allocs = [r["device_allocs"] for r in idle if r.get("device_allocs") is not None]
        if allocs:
            line += f", {allocs[-1] - allocs[0]} device allocations after its first"
        lines.append(line)
    return "\n".join(lines)


def pick_stalls(timelines: list[Timeline], over_ms: float, start: float = 0.0, end: float = float("inf")) -> str:
    """One line per server with batch picks slower than ``over_ms``: how many, their
    total, and the first few as (seconds from the first busy iteration, kind, batch
    size, ms). A pick that stalls once per new batch size is a first-use compile: on a
    fresh machine, before the startup warm-up (spec_worker/kernel_warmup.py), SGLang's
    speculative KV allocation kernel compiled there."""
    lines = []
    for timeline in timelines:
        picks, origin = picks_and_origin(timeline.records)
        if origin is None:
            continue
        slow = [r for r in picks if r["ms"] > over_ms and start <= r["t"] - origin < end]
        if slow:
            first = ", ".join(f"({r['t'] - origin:.2f} s, {r['mode']}, {r['bs']}, {r['ms']:.0f} ms)" for r in slow[:8])
            total = sum(r["ms"] for r in slow)
            lines.append(f"- {timeline.name}: {len(slow)} picks over {over_ms:g} ms, {total:.0f} ms in all: {first}")
    return "\n".join(lines)


def kernel_label(record: dict) -> str:
    """A compiled kernel as ``module.kernel`` (its module's last part), or its bare name
    where the timeline did not record the module."""
    module = record.get("module")
    return f"{module.rsplit('.', 1)[-1]}.{record['kernel']}" if module else record["kernel"]


def compiles(timelines: list[Timeline], start: float = 0.0, end: float = float("inf")) -> str:
    """One line per server that compiled Triton kernels while serving (timelines that
    record them): how many, their total, per kernel (count, ms) by total, and the first
    few as (seconds from the first busy iteration, kernel, ms). Each is a wait inside
    the call that launched the kernel; ``spec`` in the file says which specialization."""
    lines = []
    for timeline in timelines:
        _, origin = picks_and_origin(timeline.records)
        if origin is None:
            continue
        found = [
            r for r in timeline.records if r["fn"] == "triton_compile" and start <= r["t"] - origin < end
        ]
        if not found:
            continue
        by_kernel: dict[str, list[float]] = defaultdict(list)
        for r in found:
            by_kernel[kernel_label(r)].append(r["ms"])
        kernels = sorted(by_kernel.items(), key=lambda item: -sum(item[1]))
        per_kernel = ", ".join(f"{name} ({len(ms)}, {sum(ms):.0f} ms)" for name, ms in kernels)
        first = ", ".join(f"({r['t'] - origin:.2f} s, {kernel_label(r)}, {r['ms']:.0f} ms)" for r in found[:8])
        total = sum(r["ms"] for r in found)
        lines.append(
            f"- {timeline.name}: {len(found)} Triton compiles, {total:.0f} ms in all: {per_kernel}; first: {first}"
        )
    return "\n".join(lines)


def prefill_fits(timelines: list[Timeline], start: float = 0.0, end: float = float("inf")) -> str:
    """One line per server: its prefills' launch (``run_batch``) and target forward ms
    as a least-squares line over the tokens each fed, a + b x tokens. The intercept is
    what a prefill costs whatever its length: with prefill graphs off, mostly the
    eager forward's host launch, so two servers of one target differ there by the
    work a server adds to every prefill."""
    lines = []
    for timeline in timelines:
        _, origin = picks_and_origin(timeline.records)
        if origin is None:
            continue
        fits = []
        for fn, label in (("run_batch", "launch"), ("target_forward", "target forward")):
            points = [
                (r["tokens"], r["ms"])
                for r in timeline.records
                if r["fn"] == fn and r["mode"] == "prefill" and r["tokens"] and start <= r["t"] - origin < end
            ]
            if len({tokens for tokens, _ in points}) >= 2:
                line = statistics.linear_regression(*zip(*points))
                fits.append(f"{label} {line.intercept:.1f} ms + {line.slope:.4f} ms a token ({len(points)})")
        if fits:
            lines.append(f"- {timeline.name}: prefill {', '.join(fits)}")
    return "\n".join(lines)


LONG_IDLE_MS = 100.0  # an idle loop this long has let the GPU finish any step before it


def prefill_after(timelines: list[Timeline], start: float = 0.0, end: float = float("inf")) -> str:
    """Per server, the median target forward of its prefills (their launch in files
    recorded before target forwards were) by the iteration before each: idle, short
    idle (under LONG_IDLE_MS), prefill, decode or drafting decode (a decode iteration
    with no target forward through SGLang's worker: a FASER step that verified drafts,
    which runs the target's model runner directly). On the overlap schedule the work of
    that iteration may still run on the GPU, and a prefill that waits for the GPU inside
    its forward waits for it. After a long idle loop nothing is queued, so that median
    is the forward's own host time; a short one may end while the last step still runs.
    Prefills of one token (a prompt the radix cache holds but for its last token, which
    SGLang runs without a prefill graph) get a line of their own."""
    lines = []
    for timeline in timelines:
        _, origin = picks_and_origin(timeline.records)
        if origin is None:
            continue
        forwards = any(r["fn"] == "target_forward" for r in timeline.records)
        fn, label = ("target_forward", "target forward") if forwards else ("run_batch", "launch")
        by_before: dict[tuple[bool, str], list[float]] = defaultdict(list)
        before = current = None
        before_forward = current_forward = False  # whether that iteration ran a target forward
        for r in timeline.records:
            if r["fn"] == "get_next_batch_to_run":
                before, current = current, r
                before_forward, current_forward = current_forward, False
                continue
            current_forward = current_forward or r["fn"] == "target_forward"
            if r["fn"] == fn and r["mode"] == "prefill" and before is not None and start <= r["t"] - origin < end:
                kind = before["mode"]
                if kind == "idle" and 1e3 * (current["t"] - before["t"]) < LONG_IDLE_MS:
                    kind = "short idle"
                elif kind == "decode" and forwards and not before_forward:
                    kind = "drafting decode"
                by_before[(r["tokens"] == 1, kind)].append(r["ms"])
        for one_token in (False, True):
            cells = [
                f"after {kind} {statistics.median(ms):.1f} ms ({len(ms)})"
                for (single, kind), ms in sorted(by_before.items())
                if single == one_token
            ]
            if cells:
                what = "one-token prefill" if one_token else "prefill"
                lines.append(f"- {timeline.name}: {what} {label}, median {', '.join(cells)}")
    return "\n".join(lines)


def files(paths: list[Path]) -> list[Path]:
    out = []
    for path in paths:
        out.extend(sorted(path.glob("sched-*.jsonl*")) if path.is_dir() else [path])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--from", dest="start", type=float, default=0.0, help="seconds from the first busy iteration")
    parser.add_argument("--to", dest="end", type=float, default=float("inf"))
    parser.add_argument("--stat", choices=("mean", "median"), default="mean")
    parser.add_argument(
        "--by-batch", type=lambda v: [int(x) for x in v.split(",")], default=[],
        help="batch-size bucket upper bounds, e.g. 8,32,128: one row per bucket",
    )  # fmt: skip
    parser.add_argument(
        "--above", type=float, help="also split each row at this iteration ms (a FASER server's drafting steps)"
    )
    parser.add_argument("--stall-ms", type=float, default=50.0, help="list batch picks slower than this")
    args = parser.parse_args()
    timelines = [load(p) for p in files(args.paths)]
    print(table(timelines, args.start, args.end, args.stat, args.by_batch, args.above))
    extras = (
        prefill_fits(timelines, args.start, args.end),
        prefill_after(timelines, args.start, args.end),
        alloc_retries(timelines),
        pick_stalls(timelines, args.stall_ms, args.start, args.end),
        compiles(timelines, args.start, args.end),
    )
    for extra in extras:
        if extra:
            print("\n" + extra)
