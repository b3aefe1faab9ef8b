"""What a drafting step costs in SGLang's scheduler loop beyond the cost model.

The cost model is profiled from the worker's own phases (draft forwards, verify). Under
SGLang's overlap schedule a plain step publishes its lengths before its forward, so the
scheduler prepares the next step while the GPU runs, and the plain fit matches the
loop's iterations: on the 13.5B pair on an H200, 8.5-8.9 ms measured against 8.8-9.0 ms
predicted at 1-8 requests. A drafting step publishes only after its accept. The
scheduler's work before the next launch (picking the batch, reserving KV, processing
results) then runs while the GPU waits, and so does the host's preparation of the next
step's first forward. On that pair drafting iterations took 17.7-18.6 ms where the model
priced about 15 ms (results/gpu/2026-12-04-14b-ab8.md). That was enough to turn a
predicted gain into a loss at small batches.

``DraftingOverhead`` measures that excess online: the interval between the start of a
drafting step and the start of the next decode step, less the model's prediction for
the step. Only a drafting step that follows a drafting step counts, with no prefill
in between: after a plain step the host runs ahead of the GPU, and the next interval
would include the rest of that plain step. The median of the latest ``window`` such
excesses is added to the price of any drafting configuration (``allocate``'s
``drafting_overhead``).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional

# Excesses kept (the latest drafting steps), and how many are needed before any is used.
WINDOW = 64
MIN_SAMPLES = 8


@dataclass(frozen=True)
class _Step:
    started: float  # time.perf_counter() when the worker began the step
    predicted: Optional[float]  # model seconds; None: the step did not draft
    after_drafting: bool  # the decode step just before it drafted, no prefill between


class DraftingOverhead:
    """The latest drafting steps' excess over the cost model, timed from step starts."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self.excess: deque[float] = deque(maxlen=window)  # seconds, latest drafting steps
        self.measured = 0  # drafting steps timed so far
        self.min_samples = min_samples
        self._last: Optional[_Step] = None

    def step(self, started: float, predicted: Optional[float]) -> bool:
        """A decode step began at ``started``; ``predicted``: the model's seconds if it
        drafts, None if not. Closes the previous step's interval; True if that timed a
        drafting step."""
        last = self._last
        self._last = _Step(started, predicted, last is not None and last.predicted is not None)
        if last is None or last.predicted is None or not last.after_drafting:
            return False
        self.excess.append(started - last.started - last.predicted)
        self.measured += 1
        return True

    def prefill(self) -> None:
        """A prefill ran: the interval around it is not a decode step's."""
        self._last = None

    @property
    def seconds(self) -> float:
        """Median excess of the latest drafting steps; 0 before MIN_SAMPLES of them."""
        if len(self.excess) < self.min_samples:
            return 0.0
        return statistics.median(self.excess)
