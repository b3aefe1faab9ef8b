"""Where a decode step's time goes, read from a torch.profiler trace of a FASER server.

SGLang's ``/start_profile`` records the scheduler process with torch.profiler. FASER's
worker opens named ranges in it (``faser_sglang.metrics.annotate``): one per step,
``faser.decode bs=N`` or ``faser.prefill bs=N``, and inside a decode step one per
phase, in order: ``settle`` (the previous step's acceptance read back), ``policy``
(lengths, layout), then either ``plain`` (nobody drafts: a plain decode) or ``draft``
(inside it ``draft.chain`` alone when the chain fed the catch-up, else ``draft.catchup``
and then ``draft.chain``, ``draft.loop`` or, when no request drafts past its first
token, ``draft.first``; ``draft.ahead`` alone when the last step drafted this one's
tokens), ``verify`` and ``accept``, then ``ahead`` where the step queues the next
step's chain (draft_ahead.py) before its result.
On SGLang's synchronous loop a step settles its own acceptance at its end: a second
``settle`` range (then ``accept`` again), whose figures add to the first's.

Per phase of a step:

    host_ms     the range's duration: the host's time in the phase
    ops_ms      of it, inside PyTorch operators (outermost ``cpu_op`` events)
    runtime_ms  of it, inside CUDA runtime/driver calls made outside any operator
    python_ms   host_ms - ops_ms - runtime_ms: Python between the calls
    sync_ms     host time blocked in synchronize calls (a ``.cpu()``, ``.tolist()``,
                an event wait), wherever they were made
    copy_ms     host time in memcpy calls (a copy from pageable memory can block too)
    launches    kernel and graph launches, copies and memsets issued
    graphs      CUDA graph launches among them
    graph_ms    host time inside those graph launches (it grows with a graph's nodes: a
                replay of many kernels holds the host for milliseconds)
    gpu_ms      device time of the work issued in the phase (matched by CUPTI correlation)

Beside them, the phase's outermost operators that took the most time. Per step: ``period_ms`` from its start to the next step's start (the scheduler's own
work between steps included; the last step of a trace has none), and the device's
busy time in that period (the union of every kernel, copy and memset on any stream).
And its critical path (``path``, ms from the step's start): when the draft's device work
starts (``draft_start``: the first device work ``draft`` issued), when the target's
forward starts (``target_start``: the first device work of ``verify`` or ``plain``),
and when the step's last device work ends (``device_end``). A CUDA graph's kernels
start only once its launch call returns, so a step whose host reaches the target's
launch late leaves the device idle however short its own phases look.
Steps are grouped by kind (``prefill``, ``plain`` (drafting ahead, its ``ahead`` phase
may queue the next step's chain), ``drafting/chain`` (one chain fed
the catch-up), ``drafting/catchup+chain``, ``drafting/loop``, ``drafting/one`` when no
request drafted past its first token, ``drafting/ahead`` when the step before drafted
it (its own ``ahead`` phase then queues the next step's chain), and
``verify/no-drafts`` for a step that took the verify path without drafts: logprobs
were asked for) and batch size; every figure is the median over a group's steps. Each
thread's last step is left out: the profiler stops while its device work may still run.

    python -m faser_sglang.bench.step_profile TRACE.json.gz [TRACE...]   # the tables of saved traces
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from faser_sglang.metrics import RANGE_PREFIX

STEP_RANGE = re.compile(re.escape(RANGE_PREFIX) + r"(decode|prefill) bs=(\d+)$")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Phases in the order a step runs them; sub-phases of ``draft`` follow it.
PHASES = (
    "settle", "policy", "plain", "draft", "draft.catchup", "draft.chain", "draft.loop", "draft.first", "draft.ahead",
    "verify", "accept", "ahead",
)  # fmt: skip
METRICS = (
    "host_ms", "ops_ms", "runtime_ms", "python_ms", "sync_ms", "copy_ms", "launches", "graphs", "graph_ms", "gpu_ms",
)  # fmt: skip
PATH = ("draft_start", "target_start", "device_end")
# Timestamps are microseconds as floats; a nested event may end a rounding error past its parent.
EPSILON_US = 0.01
TOP_OPS = 4
# Operators under this many ms per step are not worth a column entry.
MIN_OP_MS = 0.01


@dataclass(frozen=True)
class Event:
    name: str
    start: float  # us
    end: float  # us
    tid: Any
    correlation: Optional[int] = None


class Timeline:
    """Events sorted by start, searchable by time."""

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = sorted(events, key=lambda e: (e.start, -e.end))
        self.starts = [e.start for e in self.events]
        self.longest = max((e.end - e.start for e in self.events), default=0.0)

    def within(self, start: float, end: float) -> list[Event]:
        """The events that lie within [start, end]."""
        lo = bisect.bisect_left(self.starts, start - EPSILON_US)
        hi = bisect.bisect_right(self.starts, end + EPSILON_US)
        return [e for e in self.events[lo:hi] if e.end <= end + EPSILON_US]

    def covered(self, start: float, end: float) -> float:
        """Microseconds of [start, end] that at least one event covers."""
        lo = bisect.bisect_left(self.starts, start - self.longest)
        covered, reach = 0.0, start
        for ev in self.events[lo:]:
            if ev.start >= end:
                break
            lo_t, hi_t = max(ev.start, reach), min(ev.end, end)
            if hi_t > lo_t:
                covered += hi_t - lo_t
                reach = hi_t
        return covered


@dataclass
class Trace:
    """One process's events by kind; host events per thread."""

    ranges: list[Event]  # FASER's ranges, sorted by start
    ops: dict[Any, Timeline]  # per thread: outermost cpu_op events only
    runtime: dict[Any, Timeline]  # per thread: runtime and driver calls
    device: Timeline  # kernels, copies, memsets
    device_by_correlation: dict[int, list[Event]]


@dataclass
class StepProfile:
    kind: str
    batch_size: int
    host_ms: float
    period_ms: Optional[float]  # None for the trace's last step
    device_busy_ms: Optional[float]  # in the period
    phases: dict[str, dict[str, float]]  # phase -> METRICS
    ops: dict[str, dict[str, float]]  # phase -> operator name -> ms (outermost operators)
    path: dict[str, float]  # PATH key -> ms from the step's start (a key without device work is absent)


def load_events(path: Union[str, Path]) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a chrome trace file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)["traceEvents"]


def parse(events: Iterable[dict[str, Any]]) -> Trace:
    ranges: list[Event] = []
    ops: dict[Any, list[Event]] = defaultdict(list)
    runtime: dict[Any, list[Event]] = defaultdict(list)
    device: list[Event] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        start = float(e["ts"])
        args = e.get("args") or {}
        corr = args.get("correlation")
        ev = Event(e.get("name", ""), start, start + float(e["dur"]), e.get("tid"), None if corr is None else int(corr))
        cat = e.get("cat", "")
        if cat == "user_annotation" and ev.name.startswith(RANGE_PREFIX):
            ranges.append(ev)
        elif cat == "cpu_op":
            ops[ev.tid].append(ev)
        elif cat in RUNTIME_CATEGORIES:
            runtime[ev.tid].append(ev)
        elif cat in DEVICE_CATEGORIES:
            device.append(ev)
    by_corr: dict[int, list[Event]] = defaultdict(list)
    for ev in device:
        if ev.correlation is not None:
            by_corr[ev.correlation].append(ev)
    return Trace(
        ranges=sorted(ranges, key=lambda r: r.start),
        ops={tid: Timeline(_outermost(evs)) for tid, evs in ops.items()},
        runtime={tid: Timeline(evs) for tid, evs in runtime.items()},
        device=Timeline(device),
        device_by_correlation=dict(by_corr),
    )


def steps(trace: Trace) -> list[StepProfile]:
    """Every FASER step range of the trace, with its phases measured, thread by thread."""
    by_thread: dict[Any, list[Event]] = defaultdict(list)
    for r in trace.ranges:
        by_thread[r.tid].append(r)
    out = []
    for thread_ranges in by_thread.values():
        timeline = Timeline(thread_ranges)
        step_ranges = [(r, m) for r in thread_ranges if (m := STEP_RANGE.match(r.name))]
        following = [r for r, _ in step_ranges[1:]] + [None]
        for (r, m), nxt in zip(step_ranges, following):
            inner = [x for x in timeline.within(r.start, r.end) if x is not r]
            out.append(_step(trace, r, m, inner, nxt))
    return out


def _step(trace: Trace, r: Event, m: re.Match, inner: list[Event], nxt: Optional[Event]) -> StepProfile:
    """The step of range ``r`` (its name matched as ``m``), its phases among ``inner``,
    the thread's next step range ``nxt`` (None: the last)."""
    phases: dict[str, dict[str, float]] = {}
    phase_ops: dict[str, dict[str, float]] = {}
    for x in inner:
        name = x.name.removeprefix(RANGE_PREFIX)
        if name in PHASES:  # twice in a step: the synchronous loop's settle and accept
            metrics, ops = _measure(trace, x)
            total, total_ops = phases.setdefault(name, dict.fromkeys(METRICS, 0.0)), phase_ops.setdefault(name, {})
            for k, v in metrics.items():
                total[k] += v
            for k, v in ops.items():
                total_ops[k] = total_ops.get(k, 0.0) + v
    period = device_busy = None
    if nxt is not None:
        period = (nxt.start - r.start) / 1e3
        device_busy = trace.device.covered(r.start, nxt.start) / 1e3
    path = {}
    for key, names in (("draft_start", ("draft",)), ("target_start", ("verify", "plain"))):
        work = [d for x in inner if x.name.removeprefix(RANGE_PREFIX) in names for d in _device_work(trace, x)]
        if work:
            path[key] = (min(d.start for d in work) - r.start) / 1e3
    if work := _device_work(trace, r):
        path["device_end"] = (max(d.end for d in work) - r.start) / 1e3
    return StepProfile(
        kind=_kind(m.group(1), phases),
        batch_size=int(m.group(2)),
        host_ms=(r.end - r.start) / 1e3,
        period_ms=period,
        device_busy_ms=device_busy,
        phases=phases,
        ops=phase_ops,
        path=path,
    )


def _device_work(trace: Trace, r: Event) -> list[Event]:
    """The device work issued by the runtime calls within range ``r`` (its thread)."""
    calls = trace.runtime.get(r.tid, Timeline(())).within(r.start, r.end)
    return [d for c in calls if c.correlation is not None for d in trace.device_by_correlation.get(c.correlation, ())]


def summarize(profiles: Sequence[StepProfile]) -> list[dict[str, Any]]:
    """Medians per (kind, batch size), most steps first, over the steps that have a
    next step (the module docstring says why)."""
    groups: dict[tuple[str, int], list[StepProfile]] = defaultdict(list)
    for p in profiles:
        if p.period_ms is not None:
            groups[(p.kind, p.batch_size)].append(p)
    out = []
    for (kind, bs), group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        phases = {}
        for phase in PHASES:
            having = [p.phases[phase] for p in group if phase in p.phases]
            if having:
                phases[phase] = {k: statistics.median(h[k] for h in having) for k in METRICS}
                phases[phase]["steps"] = len(having)
        top_ops = {}
        for phase in phases:
            having = [p.ops[phase] for p in group if phase in p.ops]
            names = {name for ops in having for name in ops}
            # Medians like every other figure: a profile's first step can be a warm-up outlier.
            medians = {name: statistics.median(ops.get(name, 0.0) for ops in having) for name in names}
            ranked = sorted(medians.items(), key=lambda kv: -kv[1])[:TOP_OPS]
            top_ops[phase] = [[name, ms] for name, ms in ranked if ms >= MIN_OP_MS]
        out.append(
            {
                "kind": kind,
                "batch_size": bs,
                "steps": len(group),
                "host_ms": statistics.median(p.host_ms for p in group),
                "period_ms": statistics.median(p.period_ms for p in group),
                "device_busy_ms": statistics.median(p.device_busy_ms for p in group),
                "path": {
                    k: statistics.median(p.path[k] for p in group if k in p.path)
                    for k in PATH
                    if any(k in p.path for p in group)
                },
                "phases": phases,
                "top_ops_ms": top_ops,
            }
        )
    return out


def markdown(groups: Sequence[dict[str, Any]], title: str = "") -> str:
    lines = [f"## {title}", ""] if title else []
    for g in groups:
        lines += [
            f"### {g['kind']}, batch {g['batch_size']} ({g['steps']} steps)",
            "",
            f"period {g['period_ms']:.2f} ms (step start to next step start), in the step {g['host_ms']:.2f} ms, "
            f"device busy {g['device_busy_ms']:.2f} ms of the period",
            "",
            *_path_line(g.get("path", {})),
            "| phase | host ms | ops | runtime | python | sync | copy | launches | graphs | graph launch ms | gpu ms "
            "| top operators (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for phase, m in g["phases"].items():
            ops = ", ".join(f"{name} {ms:.2f}" for name, ms in g["top_ops_ms"].get(phase, []))
            label = ("&nbsp;&nbsp;" if "." in phase else "") + phase
            lines.append(
                f"| {label} | {m['host_ms']:.2f} | {m['ops_ms']:.2f} | {m['runtime_ms']:.2f} | {m['python_ms']:.2f} "
                f"| {m['sync_ms']:.2f} | {m['copy_ms']:.2f} | {m['launches']:.0f} | {m['graphs']:.0f} "
                f"| {m['graph_ms']:.2f} | {m['gpu_ms']:.2f} | {ops} |"
            )
        lines.append("")
    return "\n".join(lines)


def _measure(trace: Trace, phase: Event) -> tuple[dict[str, float], dict[str, float]]:
    """METRICS of one phase range, and its outermost operators' ms by name."""
    empty = Timeline(())
    ops = trace.ops.get(phase.tid, empty).within(phase.start, phase.end)
    calls = trace.runtime.get(phase.tid, empty).within(phase.start, phase.end)
    op_starts = [o.start for o in ops]
    outside = [c for c in calls if not _inside_any(c, ops, op_starts)]
    ops_ms = sum(o.end - o.start for o in ops) / 1e3
    runtime_ms = sum(c.end - c.start for c in outside) / 1e3
    host_ms = (phase.end - phase.start) / 1e3
    gpu = [d for c in calls if c.correlation is not None for d in trace.device_by_correlation.get(c.correlation, ())]
    by_name: dict[str, float] = defaultdict(float)
    for o in ops:
        by_name[o.name] += (o.end - o.start) / 1e3
    metrics = {
        "host_ms": host_ms,
        "ops_ms": ops_ms,
        "runtime_ms": runtime_ms,
        "python_ms": max(host_ms - ops_ms - runtime_ms, 0.0),
        "sync_ms": sum(c.end - c.start for c in calls if "Synchronize" in c.name) / 1e3,
        "copy_ms": sum(c.end - c.start for c in calls if c.name.startswith(("cudaMemcpy", "cuMemcpy"))) / 1e3,
        "launches": float(sum(1 for c in calls if _is_launch(c.name))),
        "graphs": float(sum(1 for c in calls if "GraphLaunch" in c.name)),
        "graph_ms": sum(c.end - c.start for c in calls if "GraphLaunch" in c.name) / 1e3,
        "gpu_ms": sum(d.end - d.start for d in gpu) / 1e3,
    }
    return metrics, dict(by_name)


def _is_launch(name: str) -> bool:
    return (
        "LaunchKernel" in name
        or "LaunchCooperativeKernel" in name
        or "GraphLaunch" in name
        or name.startswith(("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset"))
    )


def _kind(step: str, phases: dict[str, Any]) -> str:
    if step == "prefill":
        return "prefill"
    if "plain" in phases:
        return "plain"
    if "draft.ahead" in phases:
        return "drafting/ahead"
    if "draft.chain" in phases:
        return "drafting/catchup+chain" if "draft.catchup" in phases else "drafting/chain"
    if "draft.loop" in phases:
        return "drafting/loop"
    if "draft.first" in phases:
        return "drafting/one"
    return "verify/no-drafts" if "verify" in phases else "other"


def _outermost(events: list[Event]) -> list[Event]:
    """Events not nested in another one (each thread's operators form a call tree)."""
    out: list[Event] = []
    for ev in sorted(events, key=lambda e: (e.start, -e.end)):
        if not out or ev.end > out[-1].end + EPSILON_US:
            out.append(ev)
    return out


def _inside_any(ev: Event, outer: list[Event], outer_starts: list[float]) -> bool:
    """Whether ``ev`` lies within one of the non-overlapping, start-sorted ``outer``."""
    i = bisect.bisect_right(outer_starts, ev.start + EPSILON_US) - 1
    return i >= 0 and _within(ev, outer[i].start, outer[i].end)


def _within(ev: Event, start: float, end: float) -> bool:
    return ev.start >= start - EPSILON_US and ev.end <= end + EPSILON_US


def _path_line(path: dict[str, float]) -> list[str]:
    """The critical path's line and a blank one, or nothing without device work."""
    said = {
        "draft_start": "the draft's work starts {:.2f}",
        "target_start": "the target's forward starts {:.2f}",
        "device_end": "device work ends {:.2f}",
    }
    parts = [said[k].format(path[k]) for k in PATH if k in path]
    return [f"critical path, ms from the step's start: {', '.join(parts)}", ""] if parts else []


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Summarise torch-profiler traces of a FASER server by step and phase.")
    p.add_argument("traces", nargs="+", type=Path, help="chrome trace files (.json or .json.gz)")
    args = p.parse_args(argv)
    for path in args.traces:
        print(markdown(summarize(steps(parse(load_events(path)))), title=path.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
