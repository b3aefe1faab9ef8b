"""Seeded request-arrival traces: steady Poisson and bursty rate-modulated Poisson.

A trace is a sorted array of arrival times (seconds from the start of the run)
plus the piecewise-constant rate schedule it was drawn from; the schedule labels
each stretch of time with a phase ("steady", or "valley"/"peak") so that results
can be split by load level and plots can shade the bursts.

Bursty model
------------
Production LLM serving load is bursty. The Azure LLM inference traces (Azure
Public Dataset, ``AzureLLMInferenceTrace`` 2023/2024) show the request rate
swinging by up to about 35x between quiet valleys and peaks, with bursts lasting
from seconds to minutes. ``bursty`` imitates that shape with a two-state
Markov-modulated Poisson process:

* the modulating process alternates between a *valley* state with rate
  ``valley_rate`` and a *peak* state with rate ``peak_to_valley * valley_rate``;
  ``peak_to_valley`` is therefore the ratio of the peak request rate to the
  valley request rate (1 = steady load, 35 = the most extreme swings observed);
* each peak lasts a log-uniform time in ``burst_seconds`` (log-uniform so that
  short spikes and minute-long surges both occur) and each valley a log-uniform
  time in ``burst_seconds`` scaled by ``(1 - peak_fraction) / peak_fraction``, so
  the expected share of time spent in peaks is ``peak_fraction``. Non-exponential
  dwell times make this, strictly, a semi-Markov modulation; the state sequence
  is the same alternating chain;
* given the drawn schedule, ``valley_rate`` is solved so that the schedule's
  average rate over ``duration`` is exactly ``mean_rate``; the arrival count is
  then Poisson with mean ``mean_rate * duration`` whatever the phase draw was;
* within each constant-rate stretch, arrivals are a homogeneous Poisson process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# The widest peak-to-valley swing the Azure LLM inference traces show.
MAX_PEAK_TO_VALLEY = 35.0


@dataclass(frozen=True, eq=False)
class RateSchedule:
    """A piecewise-constant request rate: ``rates[i]`` req/s from ``starts[i]`` on."""

    starts: np.ndarray  # segment start times, increasing, starts[0] == 0
    rates: np.ndarray  # requests per second within each segment
    phases: tuple[str, ...]  # phase label of each segment
    duration: float  # end of the last segment

    def rate_at(self, t: Union[float, np.ndarray]) -> np.ndarray:
        """The request rate at time(s) ``t``."""
        return self.rates[self._segment(t)]

    def phase_of(self, t: float) -> str:
        """The phase label ("valley", "peak", "steady") at time ``t``."""
        return self.phases[int(self._segment(t))]

    def mean_rate(self) -> float:
        """The time-averaged rate over the whole schedule."""
        return float(np.sum(self.rates * self._lengths()) / self.duration)

    def time_in(self, phase: str) -> float:
        """Total seconds spent in ``phase``."""
        return float(sum(length for length, p in zip(self._lengths(), self.phases) if p == phase))

    def spans(self, phase: str) -> list[tuple[float, float]]:
        """The ``(start, end)`` intervals spent in ``phase``, adjacent segments merged."""
        ends = np.append(self.starts[1:], self.duration)
        merged: list[tuple[float, float]] = []
        for start, end, p in zip(self.starts, ends, self.phases):
            if p != phase:
                continue
            if merged and merged[-1][1] == start:
                merged[-1] = (merged[-1][0], float(end))
            else:
                merged.append((float(start), float(end)))
        return merged

    def _lengths(self) -> np.ndarray:
        return np.diff(np.append(self.starts, self.duration))

    def _segment(self, t: Union[float, np.ndarray]) -> np.ndarray:
        return np.clip(np.searchsorted(self.starts, t, side="right") - 1, 0, len(self.starts) - 1)


@dataclass(frozen=True, eq=False)
class Trace:
    """Arrival times (s, sorted, read-only) drawn from ``schedule``."""

    arrivals: np.ndarray
    schedule: RateSchedule

    @property
    def duration(self) -> float:
        return self.schedule.duration

    def phase_of(self, t: float) -> str:
        """The phase label at time ``t``; use it to tag each request's arrival."""
        return self.schedule.phase_of(t)

    def phase_rates(self) -> dict[str, float]:
        """Measured arrivals per second within each phase."""
        labels = [self.phase_of(t) for t in self.arrivals]
        return {
            phase: labels.count(phase) / self.schedule.time_in(phase)
            for phase in sorted(set(self.schedule.phases))
            if self.schedule.time_in(phase) > 0
        }


def poisson(
    rate: float, *, duration: Optional[float] = None, n: Optional[int] = None, seed: int = 0
) -> Trace:
    """A homogeneous Poisson trace at ``rate`` req/s, over ``duration`` s or for ``n`` arrivals.

    Exactly one of ``duration`` and ``n`` must be given; with ``n`` the trace ends
    at the last arrival.
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if (duration is None) == (n is None):
        raise ValueError("give exactly one of duration and n")
    rng = np.random.default_rng(seed)
    if n is not None:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        duration = float(arrivals[-1]) if n else 0.0
    else:
        arrivals = np.sort(rng.uniform(0.0, duration, size=rng.poisson(rate * duration)))
    schedule = RateSchedule(np.zeros(1), np.array([float(rate)]), ("steady",), float(duration))
    return _trace(arrivals, schedule)


def bursty(
    mean_rate: float,
    peak_to_valley: float,
    duration: float,
    seed: int = 0,
    burst_seconds: tuple[float, float] = (5.0, 120.0),
    peak_fraction: float = 0.25,
) -> Trace:
    """A two-state Markov-modulated Poisson trace (see the module docstring).

    ``mean_rate`` is the average req/s over ``duration`` s; ``peak_to_valley`` is
    peak rate / valley rate (1 to 35); peaks last ``burst_seconds`` (log-uniform)
    and take ``peak_fraction`` of the time on average.
    """
    if mean_rate <= 0 or duration <= 0:
        raise ValueError("mean_rate and duration must be positive")
    if not 1.0 <= peak_to_valley <= MAX_PEAK_TO_VALLEY:
        raise ValueError(f"peak_to_valley must be in [1, {MAX_PEAK_TO_VALLEY:g}], got {peak_to_valley}")
    if not 0.0 < peak_fraction < 1.0:
        raise ValueError(f"peak_fraction must be in (0, 1), got {peak_fraction}")
    lo, hi = burst_seconds
    if not 0.0 < lo <= hi:
        raise ValueError(f"burst_seconds must satisfy 0 < low <= high, got {burst_seconds}")

    rng = np.random.default_rng(seed)
    valley_scale = (1.0 - peak_fraction) / peak_fraction
    starts, phases = [], []
    t, in_peak = 0.0, bool(rng.random() < peak_fraction)
    while t < duration:
        starts.append(t)
        phases.append("peak" if in_peak else "valley")
        dwell = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        t += dwell if in_peak else dwell * valley_scale
        in_peak = not in_peak
    starts_arr = np.array(starts)
    lengths = np.diff(np.append(starts_arr, duration))
    is_peak = np.array([p == "peak" for p in phases])
    relative = np.where(is_peak, peak_to_valley, 1.0)
    # Solve the valley rate on the drawn schedule so the mean is exact, not just expected.
    valley_rate = mean_rate * duration / float(np.sum(relative * lengths))
    schedule = RateSchedule(starts_arr, relative * valley_rate, tuple(phases), float(duration))

    counts = rng.poisson(schedule.rates * lengths)
    offsets = np.repeat(starts_arr, counts) + rng.random(counts.sum()) * np.repeat(lengths, counts)
    return _trace(np.sort(offsets), schedule)


def rescale(trace: Trace, factor: float) -> Trace:
    """The same trace played ``factor`` times faster: rates x factor, times / factor.

    Replays one burst pattern at a higher (or lower) load, as trace-replay tools do
    with production traces; burst lengths shrink by the same factor.
    """
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    s = trace.schedule
    schedule = RateSchedule(s.starts / factor, s.rates * factor, s.phases, s.duration / factor)
    return _trace(trace.arrivals / factor, schedule)


def plot_trace(trace: Trace, path: Union[str, Path], window: float = 10.0) -> Path:
    """Write a PNG of arrivals per ``window`` s (as req/s) over the rate schedule.

    Peak phases are shaded; the title gives the measured rate in each phase.
    """
    fig = Figure(figsize=(10, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    edges = np.arange(0.0, trace.duration + window, window)
    counts, _ = np.histogram(trace.arrivals, bins=edges)
    ax.bar(edges[:-1], counts / window, width=window, align="edge", color="tab:blue", alpha=0.5,
           label=f"arrivals per {window:g} s window")
    s = trace.schedule
    ax.step(np.append(s.starts, s.duration), np.append(s.rates, s.rates[-1]), where="post",
            color="black", linewidth=1.2, label="rate function")
    for start, end in s.spans("peak"):
        ax.axvspan(start, end, color="tab:red", alpha=0.12, linewidth=0)
    rates = trace.phase_rates()
    measured = ", ".join(f"{p} {r:.2f}" for p, r in rates.items())
    if rates.get("valley"):
        measured += f" (peak/valley {rates.get('peak', 0.0) / rates['valley']:.1f}x)"
    ax.set_title(f"{len(trace.arrivals)} arrivals over {trace.duration:.0f} s; measured req/s: {measured}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests / s")
    ax.set_xlim(0.0, trace.duration)
    ax.legend(loc="upper right")
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def _trace(arrivals: np.ndarray, schedule: RateSchedule) -> Trace:
    """Freeze the arrays so a shared trace cannot be edited under another user."""
    for array in (arrivals, schedule.starts, schedule.rates):
        array.setflags(write=False)
    return Trace(arrivals, schedule)
