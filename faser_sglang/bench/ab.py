"""The A/B benchmark: every contender on the same target, workload and arrival trace.

    python -m faser_sglang.bench.ab --target T --draft D --out results/ab \
        [--workload humaneval|sharegpt|long] [--trace bursty|poisson] \
        [--rate 4] [--peak-to-valley 20] [--duration 300] \
        [--contenders no-spec no-spec-control standalone-k1 standalone-k3 standalone-k5 standalone-k7 \
                      ngram adaptive faser faser-ad faser-ad-sync faser-ad@KEY=VALUE,...] \
        [--faser-config F] [--faser-ad-config F] [--gpus 0 1] \
        [--sweep-rates 1 4 16] [--sweep-duration 30] [--temperature 0.8 [--top-p 0.95]] \
        [--warm-up-batch 128] [--quick] [--server-args ...]

Contenders are real SGLang servers launched one after another on the same GPU (or,
with ``--gpus``, dealt onto one lane per GPU of the same machine, lanes running at
once): no speculation; STANDALONE with the same draft at fixed lengths; NGRAM; SGLang's
``--speculative-adaptive`` (0.5.17 supports it only for EAGLE/EAGLE3 heads, so with a
separate draft model it is reported as unavailable rather than silently run as
fixed STANDALONE); FASER with its default per-request EMA policy (``faser``) and
with the Adaptive Drafter (``faser-ad``, its config names the cost model; ``faser-ad-sync`` on
SGLang's synchronous schedule; ``faser-ad@draft_prefill=eager`` and the like: that config with
keys replaced, to A/B a FASER setting in the same run). Each replays the same seeded trace (Poisson or bursty
Markov-modulated Poisson) of the same workload, greedy, and the run checks every
contender produced the same tokens as no-spec (a mismatch is printed loudly: greedy
speculation must be lossless up to bf16 near-ties). With ``--temperature`` every request
samples instead (with ``--top-p``), as most served traffic does; sampled outputs are
not compared (the statistical tests check that sampled speculation follows the
target's distribution). ``no-spec-control`` serves no-spec a
second time: its mismatches are the noise floor of that check (batches differ between
runs under a dynamic trace, and bf16 GPU decoding is not batch-invariant), and its row
in the table the run-to-run spread of the timings. With ``--sweep-rates`` each
contender's server also replays a Poisson trace at every such rate after the main
trace (one server start per contender; the radix cache is flushed between traces).
Outputs in ``--out``: report.json, table.md, run.json, requests.jsonl (one record per
request of the main trace), trace.png, over_time.png,
rate_sweep.png and sweep.json with ``--sweep-rates``, and server-logs/<contender>.log
(each server's batch lines: running requests, throughput, FASER's chosen lengths and
acceptance).
Before its first trace each server is walked through every power-of-two batch up to
``--warm-up-batch`` (default the servers' ``--max-running-requests``), so no contender
pays a first-use cost inside the trace (``warm_up``), and every speculative server
compiles SGLang's KV allocation kernel at startup, as FASER's does
(``FASER_WARM_SPEC_KERNELS``, faser_sglang/baseline_warmup.py).
``--quick`` (60 s bursty trace; no-spec, standalone-k3, faser) fits one device call.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from faser_sglang import baseline_warmup
from faser_sglang.bench import report as rep
from faser_sglang.bench import servers, traces, workloads
from faser_sglang.bench.client import ReplayResult, replay

QUICK_CONTENDERS = ("no-spec", "standalone-k3", "faser")
ALL_CONTENDERS = (
    "no-spec", "no-spec-control", "standalone-k1", "standalone-k3", "standalone-k5", "standalone-k7", "ngram", "adaptive", "faser",
)  # fmt: skip
UNAVAILABLE = {
    "adaptive": "SGLang 0.5.17's --speculative-adaptive runs only with EAGLE/EAGLE3 draft heads "
    "(adaptive_unsupported_reason); this pair has a separate draft model, no EAGLE head",
}
WINDOW_S = 5.0
GREEDY = {"temperature": 0, "ignore_eos": True}


def sampling_params(temperature: float, top_p: float) -> dict:
    """Every request's sampling parameters: greedy at temperature 0."""
    if temperature == 0:
        return dict(GREEDY)
    return {"temperature": temperature, "top_p": top_p, "ignore_eos": True}


@dataclass(frozen=True)
class ContenderRun:
    name: str
    result: ReplayResult


def build_trace(args: argparse.Namespace, rate: float | None = None) -> traces.Trace:
    if rate is not None:
        return traces.poisson(rate, duration=args.sweep_duration or args.duration, seed=args.seed)
    if args.trace == "poisson":
        return traces.poisson(args.rate, duration=args.duration, seed=args.seed)
    return traces.bursty(
        args.rate,
        args.peak_to_valley,
        args.duration,
        seed=args.seed,
        burst_seconds=(args.burst_min, args.burst_max),
    )


def requests_for(trace: traces.Trace, args: argparse.Namespace) -> list[workloads.Request]:
    n = len(trace.arrivals)
    pool = workloads.load(args.workload, None if args.workload == "humaneval" else max(n, 1), seed=args.seed)
    reqs = [pool[i % len(pool)] for i in range(n)]
    if args.max_new_tokens:
        reqs = [workloads.Request(r.id, r.prompt, args.max_new_tokens, r.category) for r in reqs]
    return reqs


@dataclass(frozen=True)
class Replay:
    """One trace every contender replays: the main trace (``rate`` None) or a
    ``--sweep-rates`` point (Poisson at ``rate``)."""

    rate: float | None
    trace: traces.Trace
    reqs: list[workloads.Request]


def plan_replays(args: argparse.Namespace, trace: traces.Trace, reqs: list[workloads.Request]) -> list[Replay]:
    """The main trace, then each sweep rate once. A Poisson main trace is the point at
    its own rate, so that rate is not replayed again."""
    replays = [Replay(None, trace, reqs)]
    done = {args.rate} if args.trace == "poisson" else set()
    for rate in sorted(set(args.sweep_rates) - done):
        t = build_trace(args, rate)
        replays.append(Replay(rate, t, requests_for(t, args)))
    return replays


def run_contenders(
    args: argparse.Namespace,
    replays: Sequence[Replay],
    on_done: Callable[[list[list[ContenderRun]]], None] = lambda runs: None,
) -> list[list[ContenderRun]]:
    """Every contender replays every trace, in the order given: [replay][contender].
    Each contender is one server that replays the traces one after another (started
    once, not once per trace). With ``--gpus`` the contenders are dealt round-robin
    onto one lane per GPU; a lane runs its contenders one after another and the
    lanes run at the same time. ``on_done`` gets the contenders finished so far (in
    the order given, those that run out of turn held back) after each one."""
    names = [n for n in args.contenders if n not in UNAVAILABLE]
    for name in args.contenders:
        if name in UNAVAILABLE:
            print(f"[ab] {name}: not run: {UNAVAILABLE[name]}", flush=True)
    gpus = args.gpus or [None]
    lanes = [names[i :: len(gpus)] for i in range(len(gpus))]
    by_name: dict[str, list[ContenderRun]] = {}
    lock = threading.Lock()

    def in_order() -> list[list[ContenderRun]]:
        first = list(itertools.takewhile(lambda n: n in by_name, names))
        return [[by_name[n][i] for n in first] for i in range(len(replays))]

    def lane(names_and_gpu: tuple[list[str], str | None]) -> None:
        for name in names_and_gpu[0]:
            runs = run_one(args, replays, name, names_and_gpu[1])
            with lock:
                by_name[name] = runs
                on_done(in_order())

    with ThreadPoolExecutor(len(gpus)) as pool:
        list(pool.map(lane, zip(lanes, gpus)))
    return in_order()


def run_one(args: argparse.Namespace, replays: Sequence[Replay], name: str, gpu: str | None) -> list[ContenderRun]:
    """One contender's server replays every trace; the radix cache is flushed between
    traces, so a trace does not start with the previous one's prompts cached."""
    c = servers.contender(name, args.draft, args.k_max, args.faser_config, args.faser_ad_config)
    env = {**c.env, baseline_warmup.ENV: "1"}  # STANDALONE's compiles before the trace, as FASER's
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    where = "" if gpu is None else f" on GPU {gpu}"
    t0 = time.monotonic()
    runs = []
    with servers.launch(args.target, (*args.server_args, *c.args), env=env, timeout=1200) as server:
        print(f"[ab] {name}: ready in {time.monotonic() - t0:.0f}s{where}", flush=True)
        warm_up(server.base_url, replays[0].reqs, args.sampling, warm_up_batch(args))
        for r in replays:
            servers.flush_cache(server.base_url)
            what = "main trace" if r.rate is None else f"Poisson {r.rate:g} req/s"
            print(f"[ab] {name}: {what}, {len(r.reqs)} requests", flush=True)
            result = replay(server.base_url, r.reqs, list(r.trace.arrivals), args.sampling)
            failed = [t for t in result.timings if t.error]
            if failed:
                raise RuntimeError(f"{name} ({what}): {len(failed)} requests failed, e.g. {failed[0].error}")
            runs.append(ContenderRun(name, result))
        keep_log_lines(server.log_path, args.out / "server-logs" / f"{name}.log")
    print(f"[ab] {name}: done in {time.monotonic() - t0:.0f}s{where}", flush=True)
    return runs


# New tokens per warm-up request: a few decode steps at each batch size.
WARM_UP_TOKENS = 8


def warm_up_batch(args: argparse.Namespace) -> int:
    """The largest batch the warm-up walks a server up to: ``--warm-up-batch``, else the
    servers' ``--max-running-requests``, else 4."""
    if args.warm_up_batch:
        return args.warm_up_batch
    flags = list(args.server_args)
    if "--max-running-requests" in flags:
        return int(flags[flags.index("--max-running-requests") + 1])
    return 4


def warm_up(base_url: str, reqs: Sequence[workloads.Request], sampling: dict, max_batch: int) -> None:
    """Walk a server's batch through every power of two up to ``max_batch`` (that many
    requests at once, WARM_UP_TOKENS new tokens each), so work a server does the first
    time it meets a batch size is done before the trace. On a fresh GPU machine SGLang's
    speculative decode compiles a Triton kernel for each power of two it first decodes
    (kernel_warmup.py): ~0.1 s each, which would fall into the trace's first bursts
    and slow the speculative contenders only."""
    batch = 1
    while True:
        size = min(batch, max_batch)
        prompts = itertools.islice(itertools.cycle(reqs), size)
        warm = [workloads.Request(r.id, r.prompt, WARM_UP_TOKENS, r.category) for r in prompts]
        result = replay(base_url, warm, [0.0] * size, sampling)
        failed = [t for t in result.timings if t.error]
        if failed:
            raise RuntimeError(f"warm-up at {size} requests: {len(failed)} failed, e.g. {failed[0].error}")
        if size == max_batch:
            return
        batch *= 2


# Server log lines worth keeping per contender: SGLang's batch lines (running requests,
# throughput, accept length), FASER's length histogram and acceptance, and errors.
LOG_KEEP = ("Prefill batch", "Decode batch", "FASER", "Error", "Traceback", "ready to roll")


def keep_log_lines(log: Path, dest: Path) -> None:
    """Copy the lines of a server log that explain its timings to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with log.open(errors="replace") as src, dest.open("w") as out:
        out.writelines(line for line in src if any(k in line for k in LOG_KEEP))


def records(run: ContenderRun, trace: traces.Trace, reqs: list[workloads.Request]) -> list[rep.RequestRecord]:
    out = []
    for t in run.result.timings:
        out.append(
            rep.RequestRecord(
                contender=run.name,
                request_id=f"{t.index}:{reqs[t.index].id}",
                arrival=t.arrival,
                ttft=t.first_token - t.arrival,
                e2e=t.finished - t.arrival,
                output_tokens=t.output_tokens,
                tpot=t.tpot,
                accept_length=t.meta.get("spec_accept_length"),
                phase=trace.phase_of(t.arrival),
            )
        )
    return out


def windows(run: ContenderRun, trace: traces.Trace) -> list[rep.WindowSample]:
    """Output tokens delivered per WINDOW_S window (from streamed token counts) and
    the mean running batch size the server reported in it."""
    end = run.result.duration
    n = int(end // WINDOW_S) + 1
    tokens = [0.0] * n
    for t in run.result.timings:
        prev = 0
        for when, cum in t.token_times:
            tokens[min(int(when // WINDOW_S), n - 1)] += cum - prev
            prev = cum
    running: list[list[int]] = [[] for _ in range(n)]
    for s in run.result.load:
        running[min(int(s.t // WINDOW_S), n - 1)].append(s.running)
    return [
        rep.WindowSample(
            contender=run.name,
            time=(i + 1) * WINDOW_S,
            throughput=tokens[i] / WINDOW_S,
            running=round(sum(running[i]) / len(running[i])) if running[i] else 0,
            phase=trace.phase_of(min(i * WINDOW_S + WINDOW_S / 2, trace.duration)),
        )
        for i in range(n)
    ]


def greedy_mismatches(runs: Sequence[ContenderRun]) -> dict[str, int]:
    base = {t.index: t.output_ids for t in runs[0].result.timings}
    return {
        r.name: sum(base[t.index] != t.output_ids for t in r.result.timings) for r in runs[1:]
    }


def build(args: argparse.Namespace, runs: list[ContenderRun], trace, reqs) -> rep.Report:
    recs = [x for r in runs for x in records(r, trace, reqs)]
    wins = [w for r in runs for w in windows(r, trace)]
    report = rep.build_report(recs, wins, baseline=runs[0].name, groups=rep.fixed_length_groups(r.name for r in runs))
    rep.plot_over_time(recs, wins, args.out / "over_time.png", peak_spans=trace.schedule.spans("peak"))
    return report


def rate_sweep(
    args: argparse.Namespace, replays: Sequence[Replay], runs: Sequence[Sequence[ContenderRun]]
) -> dict[float, list]:
    """Per-contender summaries at each ``--sweep-rates`` rate (Poisson), for
    rate_sweep.png; a Poisson main trace is the point at its own rate."""
    if not args.sweep_rates:
        return {}
    sweep = {}
    for r, replay_runs in zip(replays, runs):
        rate = args.rate if r.rate is None else r.rate
        if r.rate is not None or args.trace == "poisson":
            sweep[rate] = rep.summarize([x for run in replay_runs for x in records(run, r.trace, r.reqs)])
    return dict(sorted(sweep.items()))


def write_outputs(
    args: argparse.Namespace, replays: Sequence[Replay], runs_by_replay: list[list[ContenderRun]]
) -> dict[str, int]:
    """report.json, table.md, run.json, requests.jsonl, over_time.png and rate_sweep.png for the
    contenders in ``runs_by_replay`` ([replay][contender]); returns the greedy
    mismatches against no-spec (none when requests sample)."""
    main_replay, runs = replays[0], runs_by_replay[0]
    if not runs:
        return {}
    report = build(args, runs, main_replay.trace, main_replay.reqs)
    mismatches = greedy_mismatches(runs) if args.temperature == 0 else {}
    sweep = rate_sweep(args, replays, runs_by_replay)
    if sweep:
        rep.plot_rate_sweep(sweep, args.out / "rate_sweep.png")
        (args.out / "sweep.json").write_text(json.dumps({str(r): [asdict(x) for x in s] for r, s in sweep.items()}, indent=1))
    report.write_json(args.out / "report.json")
    with (args.out / "requests.jsonl").open("w") as f:  # the records every number above comes from
        for run in runs:
            f.writelines(json.dumps(asdict(x)) + "\n" for x in records(run, main_replay.trace, main_replay.reqs))
    (args.out / "table.md").write_text(report.markdown())
    meta = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "requests": len(main_replay.reqs),
        "contenders_done": [r.name for r in runs],
        "trace_phase_rates": main_replay.trace.phase_rates(),
        "sampling": args.sampling,
        "greedy_mismatches_vs_no_spec": mismatches,
        "not_run": {k: v for k, v in UNAVAILABLE.items() if k in args.contenders},
    }
    (args.out / "run.json").write_text(json.dumps(meta, indent=1))
    return mismatches


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--k-max", type=int, default=7)
    p.add_argument("--faser-config", help="FASER_CONFIG file for the faser contender")
    p.add_argument("--faser-ad-config", help="FASER_CONFIG file for the faser-ad contender (policy adaptive)")
    p.add_argument("--gpus", nargs="*", default=[], help="GPU ids: one lane of contenders per GPU, run at once")
    p.add_argument("--workload", choices=["humaneval", "sharegpt", "long"], default="humaneval")
    p.add_argument("--max-new-tokens", type=int, default=0, help="override the workload's output lengths")
    p.add_argument("--trace", choices=["bursty", "poisson"], default="bursty")
    p.add_argument("--rate", type=float, default=4.0, help="mean requests/s")
    p.add_argument("--peak-to-valley", type=float, default=20.0)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--burst-min", type=float, default=5.0)
    p.add_argument("--burst-max", type=float, default=60.0)
    p.add_argument("--sweep-rates", type=float, nargs="*", default=[], help="also run Poisson at these rates")
    p.add_argument("--sweep-duration", type=float, default=None, help="seconds per sweep rate (default --duration)")
    p.add_argument("--contenders", nargs="+", default=list(ALL_CONTENDERS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: every request samples (default greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="of sampled requests, in (0, 1]")
    p.add_argument("--warm-up-batch", type=int, default=0,
                   help="walk each server up to this batch before timing (default: --max-running-requests in "
                   "--server-args, else 4)")
    p.add_argument("--quick", action="store_true", help="60 s trace, three contenders")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="passed to every server (last)")
    args = p.parse_args(argv)
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    if not 0 < args.top_p <= 1:
        p.error("--top-p must be in (0, 1]")
    if args.warm_up_batch < 0:
        p.error("--warm-up-batch must be >= 0 (0: the servers' --max-running-requests)")
    args.sampling = sampling_params(args.temperature, args.top_p)
    if args.quick:
        args.duration = min(args.duration, 60.0)
        args.contenders = [c for c in args.contenders if c in QUICK_CONTENDERS] or list(QUICK_CONTENDERS)
    args.contenders = baseline_first(args.contenders)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.contenders:  # a bad name or variant fails here, before any server starts
        if name not in UNAVAILABLE:
            try:
                servers.contender(name, args.draft, args.k_max, args.faser_config, args.faser_ad_config)
            except ValueError as e:
                raise SystemExit(f"--contenders: {e}") from None

    trace = build_trace(args)
    traces.plot_trace(trace, args.out / "trace.png")
    reqs = requests_for(trace, args)
    replays = plan_replays(args, trace, reqs)
    # Outputs are rewritten after every contender, so a run cut short keeps what it measured.
    runs_by_replay = run_contenders(args, replays, lambda runs: write_outputs(args, replays, runs))
    mismatches = write_outputs(args, replays, runs_by_replay)
    print((args.out / "table.md").read_text())
    if args.temperature > 0:
        print(f"[ab] requests sampled ({args.sampling}): outputs are not compared with no-spec")
    for name, n in mismatches.items():
        if name == servers.CONTROL:
            note = "  (no-spec against itself: the noise floor of this check)"
        else:
            note = "  <-- MISMATCH: greedy output differs from no-spec" if n else ""
        print(f"[ab] {name}: {n} of {len(reqs)} greedy outputs differ from no-spec{note}")
    return 0


def baseline_first(contenders: list[str]) -> list[str]:
    """The contenders with no-spec, the baseline every ratio is taken against, run
    first (moved there, with a note, when listed later); refused without it."""
    if "no-spec" not in contenders:
        raise SystemExit("--contenders must include no-spec: every ratio is taken against it")
    if contenders[0] != "no-spec":
        print("[ab] no-spec runs first: it is the baseline every ratio is taken against", flush=True)
    return ["no-spec", *(c for c in contenders if c != "no-spec")]


if __name__ == "__main__":
    sys.exit(main())
