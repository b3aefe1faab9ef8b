"""FASER step statistics: draft-length histogram, acceptance, optional JSONL trace.

SGLang already reports the mean accepted length in its decode log line and
``spec_accept_length`` / ``spec_verify_ct`` per request; this adds what is specific
to per-request lengths: how often each length was chosen and how many drafts were
accepted, logged every ``log_interval`` steps, plus an optional per-step trace file
for offline analysis, the cost profiler and tests (with per-phase times: draft,
verify, accept), and named ranges for torch.profiler traces (SGLang's
``/start_profile``; ``scripts/profile_step.py`` summarises them per phase).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import IO, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

# Every profiler range FASER opens starts with this (faser_sglang.bench.step_profile reads them).
RANGE_PREFIX = "faser."


def profiling() -> bool:
    """Whether a torch profiler records now (~0.1 us to ask; opening a range costs ~9 us
    on a slow host even when none records, so ranges open only when one does)."""
    return torch._C._autograd._profiler_enabled()


def annotate(name: str) -> AbstractContextManager:
    """A range named ``faser.<name>`` in torch.profiler traces; nothing without a profiler."""
    return torch.profiler.record_function(RANGE_PREFIX + name) if profiling() else nullcontext()


class PhaseRanges:
    """Consecutive profiler ranges, one per phase of a step: ``begin`` ends the open
    range and opens the next, ``end`` closes the last. Does nothing without a profiler."""

    def __init__(self) -> None:
        self.enabled = profiling()
        self._open: Optional[torch.profiler.record_function] = None

    def begin(self, name: str) -> None:
        if not self.enabled:
            return
        self.end()
        self._open = torch.profiler.record_function(RANGE_PREFIX + name)
        self._open.__enter__()

    def end(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None


class PhaseClock:
    """Wall time of each phase of a step, for the trace (and the cost profiler).

    Device work is asynchronous, so an enabled clock synchronizes the device at
    every mark; a disabled clock (no trace) does nothing and costs nothing.
    """

    def __init__(self, enabled: bool, device: str):
        self.enabled = enabled
        self.device = device
        self.seconds: dict[str, float] = {}
        self.labels: dict[str, str | int] = {}
        self.last_mark = time.perf_counter()  # the step's end once its last phase is marked

    def label(self, key: str, value: str | int) -> None:
        """A fact about the step for the trace (e.g. which forward the verify ran)."""
        if self.enabled:
            self.labels[key] = value

    def mark(self, phase: str) -> None:
        if not self.enabled:
            return
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[phase] = now - self.last_mark
        self.last_mark = now


@dataclass
class StepRecord:
    step: int
    rids: Sequence[str]
    seq_lens: Sequence[int]
    draft_kv_lens: Sequence[int]
    draft_lens: Sequence[int]
    num_accepted: Sequence[int]
    seconds: float
    ended: float  # perf_counter at the step's end: the gaps between steps are the work outside them
    phase_seconds: dict[str, float]
    labels: dict[str, str | int]

    def to_json(self) -> str:
        return json.dumps(
            {
                "step": self.step,
                "rids": list(self.rids),
                "seq_lens": list(self.seq_lens),
                "draft_kv_lens": list(self.draft_kv_lens),
                "draft_lens": list(self.draft_lens),
                "num_accepted": list(self.num_accepted),
                "seconds": round(self.seconds, 6),
                "ended": round(self.ended, 6),
                **{f"{k}_seconds": round(v, 6) for k, v in self.phase_seconds.items()},
                **self.labels,
            }
        )


# How a decode step drafted, counted in the log summary: ``in-step`` drafted for itself,
# ``ahead`` verified drafts made at the end of the step before (draft_ahead.py),
# ``plain`` decoded one token per request, ``plain+chain`` did so and queued the next
# step's chain.
STEP_KINDS = ("in-step", "ahead", "plain", "plain+chain")


@dataclass
class FaserStats:
    log_interval: int = 200
    trace_path: Optional[str] = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    length_hist: Counter = field(default_factory=Counter)
    step_kinds: Counter = field(default_factory=Counter)  # STEP_KINDS -> steps
    _trace: Optional[IO[str]] = None

    def clock(self, device: str) -> PhaseClock:
        return PhaseClock(self.trace_path is not None, device)

    def record(
        self,
        rids: Sequence[str],
        seq_lens: Sequence[int],
        draft_kv_lens: Sequence[int],
        draft_lens: Sequence[int],
        num_accepted: Sequence[int],
        seconds: float,  # the step's wall time (a step may be recorded after the next one started)
        clock: PhaseClock,
        kind: str,  # one of STEP_KINDS
    ) -> None:
        if kind not in STEP_KINDS:
            raise ValueError(f"unknown FASER step kind {kind!r}")
        self.steps += 1
        self.step_kinds[kind] += 1
        self.drafted += sum(draft_lens)
        self.accepted += sum(num_accepted)
        self.length_hist.update(draft_lens)
        if self.trace_path is not None:
            if self._trace is None:
                self._trace = open(self.trace_path, "a", buffering=1)
            rec = StepRecord(
                self.steps,
                rids,
                seq_lens,
                draft_kv_lens,
                draft_lens,
                num_accepted,
                seconds,
                clock.last_mark,
                clock.seconds,
                clock.labels,
            )
            self._trace.write(rec.to_json() + "\n")
        if self.steps % self.log_interval == 0:
            logger.info("FASER %s", self.summary())

    def summary(self) -> str:
        rate = self.accepted / self.drafted if self.drafted else 0.0
        hist = " ".join(f"k{k}:{n}" for k, n in sorted(self.length_hist.items()))
        kinds = " ".join(f"{k}:{self.step_kinds[k]}" for k in STEP_KINDS if self.step_kinds[k])
        return f"steps={self.steps} draft_accept_rate={rate:.3f} draft_lengths[{hist}] step_kinds[{kinds}]"
