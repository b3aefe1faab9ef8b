"""Compare a cost model with the decode steps a FASER server traced while serving.

    python scripts/check_costs.py --costs costs.json --trace trace.jsonl [--key 0] [--steps-csv steps.csv]

A server whose FASER_CONFIG sets ``trace_path`` writes one record per decode step:
lengths, committed and draft-KV lengths, the step's seconds and each phase's
(policy, draft, verify, accept), and the time it ended. Tracing synchronizes the
device at every phase, so traced steps lose SGLang's overlap: the table says where
the model errs under real traffic (batches that grow, prompts the draft has not
seen yet), not how fast the server is.

For every step the cost model predicts its seconds exactly as the allocator and the
profiler's fit do (catch-ups from the draft-KV lag, in the traced piece size). The
table groups steps by batch size, drafting and plain apart: steps, measured and
predicted medians, the median of measured / predicted, MAPE, the median catch-up
tokens of the requests that drafted, the median of every traced phase, and the
median gap before a step (from the previous step's end to this one's start: the
prefills and the scheduler's work between decode steps). ``--steps-csv`` writes the
same per step, in the order the steps ended, to plot against time.
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Optional, Sequence

from faser_sglang.spec_worker.adaptive import CostModel, StepSample, read_cost_entries, sample_time

BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 30))
PHASES = ("policy", "draft", "verify", "accept")


@dataclass(frozen=True)
class CheckedStep:
    ended: Optional[float]  # perf_counter at the step's end (None in older traces)
    batch_size: int
    drafts: int  # draft tokens of the step
    catchup: tuple[int, ...]  # catch-up tokens of each request that drafted
    measured: float
    predicted: float
    phases: dict[str, float]  # traced phase -> seconds
    gap: Optional[float] = None  # seconds from the previous step's end to this one's start


def check(model: CostModel, records: Sequence[dict]) -> list[CheckedStep]:
    """Every record's measured and predicted seconds, in the order the steps ended
    (records of drafting steps are written when the next step settles them)."""
    steps = []
    for rec in records:
        s = StepSample.from_trace_record(rec)
        steps.append(
            CheckedStep(
                ended=rec.get("ended"),
                batch_size=len(s.draft_lens),
                drafts=sum(s.draft_lens),
                catchup=tuple(c for k, c in zip(s.draft_lens, s.catchup) if k > 0),
                measured=s.seconds,
                predicted=sample_time(model, s),
                phases={p: float(rec[f"{p}_seconds"]) for p in PHASES if f"{p}_seconds" in rec},
            )
        )
    if any(s.ended is None for s in steps):
        return steps
    steps.sort(key=lambda s: s.ended)
    out = steps[:1]
    for prev, step in zip(steps, steps[1:]):
        gap = step.ended - step.measured - prev.ended
        out.append(CheckedStep(**{**step.__dict__, "gap": max(gap, 0.0)}))
    return out


def table(steps: Sequence[CheckedStep]) -> str:
    head = (
        "| batch size | steps | kind | measured ms (p50) | predicted ms (p50) | measured / predicted (p50) | MAPE"
        " | catch-up tokens per drafting request (p50) | "
        + " | ".join(f"{p} ms (p50)" for p in PHASES)
        + " | gap before ms (p50) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for lo, hi in BUCKETS:
        for kind in ("drafting", "plain"):
            group = [s for s in steps if lo <= s.batch_size <= hi and (s.drafts > 0) == (kind == "drafting")]
            if not group:
                continue
            ratios = [s.measured / s.predicted for s in group]
            catchups = [c for s in group for c in s.catchup]
            gaps = [s.gap for s in group if s.gap is not None]
            phases = [[s.phases[p] for s in group if p in s.phases] for p in PHASES]
            cells = [
                f"{lo}" if lo == hi else (f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi}"),
                str(len(group)),
                kind,
                _ms(median(s.measured for s in group)),
                _ms(median(s.predicted for s in group)),
                f"{median(ratios):.2f}",
                f"{100 * sum(abs(r - 1) for r in ratios) / len(ratios):.1f}%",
                f"{median(catchups):.0f}" if catchups else "-",
                *(_ms(median(v)) if v else "-" for v in phases),
                _ms(median(gaps)) if gaps else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(steps: Sequence[CheckedStep], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ended", "batch_size", "drafts", "catchup_tokens", "measured_s", "predicted_s", "gap_s",
                    *(f"{p}_s" for p in PHASES)])  # fmt: skip
        for s in steps:
            w.writerow([s.ended, s.batch_size, s.drafts, sum(s.catchup), s.measured, s.predicted, s.gap,
                        *(s.phases.get(p) for p in PHASES)])  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--costs", required=True, help="cost file (scripts/profile_costs.py)")
    p.add_argument("--trace", required=True, help="the server's FASER trace (FASER_CONFIG trace_path)")
    p.add_argument("--key", type=int, default=0, help="index of the cost file's entry to check")
    p.add_argument("--steps-csv", type=Path, default=None, help="also write every checked step here")
    args = p.parse_args(argv)

    entries = list(read_cost_entries(args.costs)[0].items())
    if not 0 <= args.key < len(entries):
        p.error(f"--key {args.key}: the cost file has {len(entries)} entries")
    key, model = entries[args.key]
    with open(args.trace) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        p.error(f"{args.trace} holds no steps")
    steps = check(model, records)
    print(f"cost model: {key}\n{len(steps)} traced steps\n")
    print(table(steps))
    if args.steps_csv is not None:
        write_csv(steps, args.steps_csv)
        print(f"\nper step: {args.steps_csv}")


if __name__ == "__main__":
    main()
