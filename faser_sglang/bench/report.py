"""Benchmark results: per-contender summaries, ratios, JSON, a Markdown table, plots.

Inputs are plain records that a benchmark runner produces (one per finished
request, plus periodic server-side samples); everything here is a pure function
of them, so the numbers in a report can be checked by hand and in unit tests.
Times are seconds throughout; the Markdown table shows TTFT/TPOT in milliseconds.

Ratios compare each contender with a named baseline (normally "no-spec") and
with the best member of each named group (e.g. the fixed-length STANDALONE
contenders, best chosen by throughput), so a claim like "1.3x over the best
fixed draft length" is read off the table rather than cherry-picked.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LATENCY_METRICS = ("ttft", "tpot", "e2e")

T = TypeVar("T")
K = TypeVar("K")


@dataclass(frozen=True)
class RequestRecord:
    """One finished request as the client saw it."""

    contender: str
    request_id: str
    arrival: float  # s from the start of the run
    ttft: float  # s, arrival to first output token
    e2e: float  # s, arrival to last output token
    output_tokens: int
    tpot: Optional[float]  # s per output token after the first; None for one-token outputs
    accept_length: Optional[float] = None  # output tokens per verify step (speculative runs)
    phase: str = "steady"  # trace phase at arrival


@dataclass(frozen=True)
class WindowSample:
    """Server-side load over one sampling window of a run."""

    contender: str
    time: float  # s from the start of the run (window end)
    throughput: float  # output tokens/s generated in the window
    running: int  # running batch size
    phase: str = "steady"  # trace phase at ``time``


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Percentiles":
        """Linear-interpolated percentiles (numpy's default) of a non-empty sample."""
        if len(values) == 0:
            raise ValueError("percentiles of an empty sample")
        p50, p90, p99 = np.percentile(np.asarray(values, dtype=float), [50, 90, 99])
        return cls(float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class PhaseSummary:
    """Load-phase slice of one contender's run (e.g. the peaks of a bursty trace)."""

    requests: int  # requests that arrived in the phase
    # Output tokens of those requests over the span from the first one's arrival to the
    # last one's completion: what the server did with the phase's load, drain included.
    served_throughput: Optional[float]
    throughput: Optional[float]  # mean window throughput in the phase; None without samples
    ttft: Optional[Percentiles]
    tpot: Optional[Percentiles]


@dataclass(frozen=True)
class ContenderSummary:
    contender: str
    requests: int
    output_tokens: int
    duration: float  # s, first arrival to last completion
    throughput: float  # output tokens/s over ``duration``
    ttft: Percentiles
    tpot: Optional[Percentiles]  # None when no request produced two tokens
    e2e: Percentiles
    accept_length: Optional[float]  # all output tokens / all verify steps
    phases: dict[str, PhaseSummary]
    # Each burst of a bursty trace (a run of peak-phase arrivals), in arrival order.
    bursts: tuple[PhaseSummary, ...] = ()


@dataclass(frozen=True)
class Ratios:
    """One contender relative to a reference contender (value / reference value)."""

    reference: str
    throughput: float  # above 1 is better
    ttft_p99: float  # below 1 is better
    tpot_p50: Optional[float]  # below 1 is better; None when either side has no TPOT
    e2e_p99: float  # below 1 is better


@dataclass(frozen=True)
class Report:
    summaries: tuple[ContenderSummary, ...]
    baseline: str
    best_of: dict[str, str]  # group label -> its member with the highest throughput
    ratios: dict[str, dict[str, Ratios]]  # contender -> reference label -> ratios

    def write_json(self, path: Union[str, Path]) -> Path:
        """Write the whole report as indented JSON."""
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    def markdown_table(self) -> str:
        """One row per contender; ratio columns for the baseline and each group's best."""
        labels = [self.baseline, *self.best_of]
        header = ["contender", "requests", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "E2E p50/p99 s",
                  "accept"]
        for label in labels:
            name = label if label == self.baseline else f"{label} ({self.best_of[label]})"
            header += [f"tok/s vs {name}", f"TPOT p50 vs {name}"]
        rows = [header, ["---"] * len(header)]
        for s in self.summaries:
            row = [
                s.contender,
                str(s.requests),
                f"{s.throughput:.1f}",
                f"{s.ttft.p50 * 1e3:.0f} / {s.ttft.p99 * 1e3:.0f}",
                "-" if s.tpot is None else f"{s.tpot.p50 * 1e3:.1f} / {s.tpot.p99 * 1e3:.1f}",
                f"{s.e2e.p50:.2f} / {s.e2e.p99:.2f}",
                "-" if s.accept_length is None else f"{s.accept_length:.2f}",
            ]
            for label in labels:
                r = self.ratios[s.contender][label]
                row += [f"{r.throughput:.2f}x", "-" if r.tpot_p50 is None else f"{r.tpot_p50:.2f}x"]
            rows.append(row)
        return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"

    def phase_table(self) -> str:
        """One row per load phase and contender (bursty traces: peak and valley), with
        the served throughput of the phase's requests as a ratio to the baseline's and
        each group best's in the same phase, then the mean window throughput. Empty when
        the run has a single phase.

        The served column is the one to compare: a window samples whatever the server
        streamed while the phase lasted, so when a peak is as short as a window, a
        window's tokens depend on where the burst falls in it."""
        phases = sorted({p for s in self.summaries for p in s.phases})
        if len(phases) < 2:
            return ""
        by_name = {s.contender: s for s in self.summaries}
        refs = [self.baseline, *self.best_of.values()]
        header = ["phase", "contender", "requests", "served tok/s", *(f"served vs {r}" for r in refs),
                  "window tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]  # fmt: skip
        rows = [header, ["---"] * len(header)]
        for phase in phases:
            for s in self.summaries:
                ph = s.phases.get(phase)
                if ph is None:
                    continue
                row = [phase, s.contender, str(ph.requests), _num(ph.served_throughput, "{:.1f}")]
                row += _served_ratios(ph, [by_name[r].phases.get(phase) for r in refs])
                row += [_num(ph.throughput, "{:.1f}"), _ms(ph.ttft, "{:.0f}"), _ms(ph.tpot, "{:.1f}")]
                rows.append(row)
        return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"

    def burst_table(self) -> str:
        """One row per burst and contender, with the served throughput of the burst's
        requests as a ratio to the baseline's and each group best's in the same burst.
        Empty with fewer than two bursts (the phase table has the one).

        Bursts differ: one that stays under the running-request cap and one that holds
        the server at it test different things, and the peak phase pools them."""
        count = max((len(s.bursts) for s in self.summaries), default=0)
        if count < 2:
            return ""
        by_name = {s.contender: s for s in self.summaries}
        refs = [self.baseline, *self.best_of.values()]
        header = ["burst", "contender", "requests", "served tok/s", *(f"served vs {r}" for r in refs),
                  "TTFT p50/p99 ms", "TPOT p50/p99 ms"]  # fmt: skip
        rows = [header, ["---"] * len(header)]
        for b in range(count):
            for s in self.summaries:
                if b >= len(s.bursts):
                    continue
                burst = s.bursts[b]
                row = [str(b + 1), s.contender, str(burst.requests), _num(burst.served_throughput, "{:.1f}")]
                same = [by_name[r].bursts[b] if b < len(by_name[r].bursts) else None for r in refs]
                row += _served_ratios(burst, same)
                row += [_ms(burst.ttft, "{:.0f}"), _ms(burst.tpot, "{:.1f}")]
                rows.append(row)
        return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"

    def markdown(self) -> str:
        """table.md: the contender table, then per load phase and per burst where the
        trace has them."""
        out = self.markdown_table()
        for title, table in (("Per load phase", self.phase_table()), ("Per burst", self.burst_table())):
            if table:
                out += f"\n{title}:\n\n{table}"
        return out


def _served_ratios(part: PhaseSummary, refs: Sequence[Optional[PhaseSummary]]) -> list[str]:
    """Table cells: ``part``'s served throughput over each reference's same slice ("-"
    where either has none)."""
    cells = []
    for ref in refs:
        ok = part.served_throughput is not None and ref is not None and ref.served_throughput
        cells.append(f"{part.served_throughput / ref.served_throughput:.2f}x" if ok else "-")
    return cells


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _ms(p: Optional[Percentiles], fmt: str) -> str:
    return "-" if p is None else f"{fmt.format(p.p50 * 1e3)} / {fmt.format(p.p99 * 1e3)}"


def summarize(
    records: Iterable[RequestRecord], windows: Iterable[WindowSample] = ()
) -> list[ContenderSummary]:
    """Per-contender summaries, in the order contenders first appear in ``records``."""
    by_contender = _group(records, lambda r: r.contender)
    windows_by_contender = _group(windows, lambda w: w.contender)
    return [
        _summarize_one(name, recs, windows_by_contender.get(name, [])) for name, recs in by_contender.items()
    ]


def ratios(summary: ContenderSummary, reference: ContenderSummary) -> Ratios:
    """``summary`` relative to ``reference``."""
    return Ratios(
        reference=reference.contender,
        throughput=summary.throughput / reference.throughput,
        ttft_p99=summary.ttft.p99 / reference.ttft.p99,
        tpot_p50=summary.tpot.p50 / reference.tpot.p50 if summary.tpot and reference.tpot else None,
        e2e_p99=summary.e2e.p99 / reference.e2e.p99,
    )


def build_report(
    records: Iterable[RequestRecord],
    windows: Iterable[WindowSample] = (),
    baseline: str = "no-spec",
    groups: Optional[Mapping[str, Sequence[str]]] = None,
) -> Report:
    """Summarize every contender and compare it with ``baseline`` and each group's best.

    ``groups`` maps a label (e.g. "best STANDALONE") to the contenders it picks
    from; the member with the highest throughput becomes that label's reference.
    """
    summaries = summarize(records, windows)
    by_name = {s.contender: s for s in summaries}
    if baseline not in by_name:
        raise ValueError(f"baseline contender {baseline!r} has no records")
    best_of = {}
    for label, members in (groups or {}).items():
        missing = [m for m in members if m not in by_name]
        if missing or not members:
            raise ValueError(f"group {label!r} needs contenders with records; missing: {missing or 'all'}")
        best_of[label] = max(members, key=lambda m: by_name[m].throughput)
    references = {baseline: by_name[baseline], **{label: by_name[m] for label, m in best_of.items()}}
    table = {s.contender: {label: ratios(s, ref) for label, ref in references.items()} for s in summaries}
    return Report(tuple(summaries), baseline, best_of, table)


def fixed_length_groups(contenders: Iterable[str]) -> dict[str, list[str]]:
    """build_report's ``groups`` for an A/B run: the fixed-length STANDALONE contenders
    (``standalone-k<N>``), when it has any."""
    standalone = [name for name in contenders if name.startswith("standalone-k")]
    return {"best STANDALONE": standalone} if standalone else {}


def read_records(path: Union[str, Path]) -> list[RequestRecord]:
    """The records of an A/B run's requests.jsonl (or .jsonl.gz)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [RequestRecord(**json.loads(line)) for line in f if line.strip()]


def plot_over_time(
    records: Iterable[RequestRecord],
    windows: Iterable[WindowSample],
    path: Union[str, Path],
    peak_spans: Sequence[tuple[float, float]] = (),
    window: float = 10.0,
    latency: str = "e2e",
) -> Path:
    """PNG of throughput, running batch and median latency over a run, one line per contender.

    Latency is the median ``latency`` metric of the requests arriving in each
    ``window`` s bin; ``peak_spans`` (from the trace schedule) are shaded.
    """
    _check_metric(latency)
    by_contender = _group(records, lambda r: r.contender)
    windows_by_contender = _group(windows, lambda w: w.contender)
    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_tput, ax_batch, ax_lat = fig.subplots(3, 1, sharex=True)
    names = list(dict.fromkeys([*by_contender, *windows_by_contender]))
    for color, name in zip(_colors(len(names)), names):
        samples = sorted(windows_by_contender.get(name, []), key=lambda w: w.time)
        times = [w.time for w in samples]
        ax_tput.plot(times, [w.throughput for w in samples], color=color, label=name)
        ax_batch.plot(times, [w.running for w in samples], color=color, label=name)
        recs = by_contender.get(name, [])
        # One-token outputs have no TPOT.
        points = [(r.arrival, v) for r in recs if (v := getattr(r, latency)) is not None]
        if points:
            centers, medians = _binned_median(*zip(*points), window)
            ax_lat.plot(centers, medians, color=color, marker=".", label=name)
    for ax in (ax_tput, ax_batch, ax_lat):
        for start, end in peak_spans:
            ax.axvspan(start, end, color="tab:red", alpha=0.12, linewidth=0)
    ax_tput.set_ylabel("output tokens / s")
    ax_batch.set_ylabel("running requests")
    ax_lat.set_ylabel(f"median {latency.upper()} (s)")
    ax_lat.set_xlabel("time (s); shaded = peak phase")
    # Below the plots: contender names with server flags run wider than an axes.
    fig.legend(*ax_tput.get_legend_handles_labels(), loc="outside lower center", fontsize="small")
    return _save(fig, path)


def plot_rate_sweep(
    sweep: Mapping[float, Sequence[ContenderSummary]],
    path: Union[str, Path],
    latency: str = "tpot",
) -> Path:
    """PNG of throughput and ``latency`` p50 (solid) / p99 (dashed) against request rate.

    ``sweep`` maps each fixed request rate (req/s) to the summaries of that run.
    """
    _check_metric(latency)
    rates = sorted(sweep)
    points: dict[str, list[tuple[float, ContenderSummary]]] = {}
    for rate in rates:
        for s in sweep[rate]:
            points.setdefault(s.contender, []).append((rate, s))
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_tput, ax_lat = fig.subplots(1, 2)
    for color, (name, series) in zip(_colors(len(points)), points.items()):
        xs = [rate for rate, _ in series]
        ax_tput.plot(xs, [s.throughput for _, s in series], color=color, marker="o", label=name)
        lat = [(rate, p) for rate, s in series if (p := getattr(s, latency)) is not None]
        lat_x = [rate for rate, _ in lat]
        ax_lat.plot(lat_x, [p.p50 for _, p in lat], color=color, marker="o", label=f"{name} p50")
        ax_lat.plot(lat_x, [p.p99 for _, p in lat], color=color, marker="x", linestyle="--",
                    label=f"{name} p99")
    ax_tput.set_xlabel("request rate (req/s)")
    ax_tput.set_ylabel("output tokens / s")
    ax_tput.legend(fontsize="small")
    ax_lat.set_xlabel("request rate (req/s)")
    ax_lat.set_ylabel(f"{latency.upper()} (s)")
    ax_lat.legend(fontsize="x-small", ncol=2)
    return _save(fig, path)


def _summarize_one(name: str, records: list[RequestRecord], windows: list[WindowSample]) -> ContenderSummary:
    return ContenderSummary(
        contender=name,
        requests=len(records),
        output_tokens=sum(r.output_tokens for r in records),
        duration=_span(records),
        throughput=_served_throughput(records) or 0.0,
        ttft=Percentiles.of([r.ttft for r in records]),
        tpot=_tpot(records),
        e2e=Percentiles.of([r.e2e for r in records]),
        accept_length=_accept_length(records),
        phases=_phases(records, windows),
        bursts=tuple(_slice_summary(b) for b in _bursts(records)),
    )


def _accept_length(records: list[RequestRecord]) -> Optional[float]:
    """Output tokens per verify step over all speculative requests.

    Each request's verify steps are its tokens / its accept length; pooling steps
    (rather than averaging per-request lengths) weights long requests by their
    share of the decoding work, as SGLang's server-wide accept length does.
    """
    spec = [r for r in records if r.accept_length is not None and r.accept_length > 0]
    steps = sum(r.output_tokens / r.accept_length for r in spec)
    return sum(r.output_tokens for r in spec) / steps if steps > 0 else None


def _tpot(records: list[RequestRecord]) -> Optional[Percentiles]:
    """TPOT percentiles over the requests that have one (two or more output tokens)."""
    values = [r.tpot for r in records if r.tpot is not None]
    return Percentiles.of(values) if values else None


def _phases(records: list[RequestRecord], windows: list[WindowSample]) -> dict[str, PhaseSummary]:
    recs = _group(records, lambda r: r.phase)
    samples = _group(windows, lambda w: w.phase)
    out = {}
    for phase in sorted({*recs, *samples}):
        ws = samples.get(phase, [])
        # Windows are equally long, so their mean is tokens generated / time in phase.
        out[phase] = _slice_summary(recs.get(phase, []), float(np.mean([w.throughput for w in ws])) if ws else None)
    return out


def _slice_summary(records: list[RequestRecord], window_throughput: Optional[float] = None) -> PhaseSummary:
    """A phase's or a burst's requests summarized (``window_throughput``: the mean
    window throughput where the slice has windows)."""
    return PhaseSummary(
        requests=len(records),
        served_throughput=_served_throughput(records),
        throughput=window_throughput,
        ttft=Percentiles.of([r.ttft for r in records]) if records else None,
        tpot=_tpot(records),
    )


def _bursts(records: list[RequestRecord]) -> list[list[RequestRecord]]:
    """The runs of consecutive peak-phase arrivals in ``records`` (one contender's), in
    arrival order. Contenders replay the same arrivals, so burst n is the same
    requests for each."""
    runs: list[list[RequestRecord]] = []
    previous = None
    for r in sorted(records, key=lambda r: r.arrival):
        if r.phase == "peak":
            if previous != "peak":
                runs.append([])
            runs[-1].append(r)
        previous = r.phase
    return runs


def _served_throughput(records: list[RequestRecord]) -> Optional[float]:
    """Output tokens of ``records`` / (last completion - first arrival); None if empty."""
    span = _span(records) if records else 0.0
    return sum(r.output_tokens for r in records) / span if span > 0 else None


def _span(records: list[RequestRecord]) -> float:
    """Seconds from the first arrival to the last completion of ``records`` (non-empty)."""
    return max(r.arrival + r.e2e for r in records) - min(r.arrival for r in records)


def _group(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """``items`` grouped by ``key``, groups and members in first-seen order."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def _binned_median(
    times: Sequence[float], values: Sequence[float], window: float
) -> tuple[np.ndarray, np.ndarray]:
    """Centers and medians of the non-empty ``window``-wide bins of ``times``."""
    bins = np.floor(np.asarray(times) / window).astype(int)
    values = np.asarray(values, dtype=float)
    keys = np.unique(bins)
    return (keys + 0.5) * window, np.array([np.median(values[bins == k]) for k in keys])


def _check_metric(latency: str) -> None:
    if latency not in LATENCY_METRICS:
        raise ValueError(f"latency must be one of {LATENCY_METRICS}, got {latency!r}")


def _colors(n: int) -> list:
    """Distinct colors for ``n`` contenders (tab10 up to ten, tab20 beyond)."""
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig: Figure, path: Union[str, Path]) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print an A/B run's table.md again from its requests (e.g. a results directory's
    requests.jsonl.gz), with this version's tables."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("requests", type=Path, help="requests.jsonl or requests.jsonl.gz of an A/B run")
    p.add_argument("--baseline", help="contender the ratios are to (default: the first in the file)")
    args = p.parse_args(argv)
    records = read_records(args.requests)
    if not records:
        p.error(f"{args.requests} has no requests")
    names = list(dict.fromkeys(r.contender for r in records))
    report = build_report(records, baseline=args.baseline or names[0], groups=fixed_length_groups(names))
    print(report.markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
