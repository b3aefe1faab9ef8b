"""Benchmark workloads, arrival traces and report arithmetic (CPU, no server)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from faser_sglang.bench import report, traces, workloads
from faser_sglang.bench.report import RequestRecord, WindowSample

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- workloads ---------------------------------------------------------------


def test_humaneval_has_all_164_prompts():
    reqs = workloads.humaneval()
    assert len(reqs) == 164
    assert len({r.id for r in reqs}) == 164
    assert reqs[0].id == "HumanEval/0" and "def has_close_elements" in reqs[0].prompt
    assert all(r.max_new_tokens == 256 for r in reqs)
    assert len(workloads.load("humaneval", n=10)) == 10


def test_sharegpt_reads_truncated_dump_and_is_seeded():
    # The dump ends mid-record; every complete record before it must be recovered.
    assert sum(1 for _ in workloads._sharegpt_records()) > 17000
    a = workloads.sharegpt(1000, seed=7)
    assert a == workloads.sharegpt(1000, seed=7)
    assert len({r.id for r in a}) == 1000
    assert all(r.prompt.strip() for r in a)
    budgets = [r.max_new_tokens for r in a]
    assert min(budgets) >= 4 and max(budgets) <= 1024
    assert len(set(budgets)) > 100  # taken from the recorded answers, not a constant
    other = workloads.sharegpt(50, seed=8, max_new_tokens=128)
    assert [r.id for r in other] != [r.id for r in a[:50]]
    assert {r.max_new_tokens for r in other} == {128}


def test_long_context_inputs_are_long_with_short_outputs():
    reqs = workloads.load("long", n=20, seed=3)
    assert len(reqs) == 20
    assert all(len(r.prompt) >= 8000 for r in reqs)
    assert all(r.max_new_tokens == 32 for r in reqs)
    assert {r.category for r in reqs} == {"summarize", "functions"}
    questions = ("Summarize what the code above does.", "Which functions are defined above?")
    assert all(r.prompt.endswith(questions) for r in reqs)
    assert reqs == workloads.long_context(20, seed=3)


def test_load_rejects_unknown_workload():
    with pytest.raises(ValueError):
        workloads.load("mmlu", n=1)


# --- traces ------------------------------------------------------------------


def test_poisson_rate_matches():
    trace = traces.poisson(4.0, n=20000, seed=0)
    gaps = np.diff(np.concatenate([[0.0], trace.arrivals]))
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.03)
    assert np.std(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: std == mean
    by_time = traces.poisson(4.0, duration=5000.0, seed=1)
    assert len(by_time.arrivals) / 5000.0 == pytest.approx(4.0, rel=0.03)
    assert by_time.phase_of(10.0) == "steady"


def test_bursty_peak_to_valley_and_mean_rate():
    trace = traces.bursty(mean_rate=5.0, peak_to_valley=20.0, duration=3600.0, seed=1)
    assert np.all(np.diff(trace.arrivals) >= 0)
    assert trace.arrivals.min() >= 0 and trace.arrivals.max() <= 3600.0
    assert trace.schedule.mean_rate() == pytest.approx(5.0)
    assert len(trace.arrivals) / 3600.0 == pytest.approx(5.0, rel=0.05)
    measured = trace.phase_rates()
    assert measured["peak"] / measured["valley"] == pytest.approx(20.0, rel=0.1)
    # Bursts last seconds to minutes.
    lengths = [end - start for start, end in trace.schedule.spans("peak")]
    assert min(lengths) >= 5.0 - 1e-9 and max(lengths) <= 120.0 + 1e-9
    peak_start, _ = trace.schedule.spans("peak")[0]
    assert trace.phase_of(peak_start + 1e-6) == "peak"


def test_bursty_is_deterministic_and_bounded():
    a = traces.bursty(2.0, 10.0, 600.0, seed=4)
    b = traces.bursty(2.0, 10.0, 600.0, seed=4)
    assert np.array_equal(a.arrivals, b.arrivals)
    assert not np.array_equal(a.arrivals, traces.bursty(2.0, 10.0, 600.0, seed=5).arrivals)
    with pytest.raises(ValueError):
        traces.bursty(2.0, 50.0, 600.0)


def test_rescale_speeds_up_trace():
    trace = traces.bursty(2.0, 10.0, 600.0, seed=4)
    fast = traces.rescale(trace, 3.0)
    assert fast.duration == pytest.approx(200.0)
    assert fast.schedule.mean_rate() == pytest.approx(6.0)
    assert np.allclose(fast.arrivals * 3.0, trace.arrivals)
    assert fast.phase_of(trace.schedule.spans("peak")[0][0] / 3.0 + 1e-6) == "peak"


def test_plot_trace_writes_png(tmp_path):
    path = traces.plot_trace(traces.bursty(3.0, 20.0, 900.0, seed=2), tmp_path / "trace.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


# --- report ------------------------------------------------------------------


def _records(contender: str, scale: float, tokens: int, accept=None) -> list[RequestRecord]:
    """101 requests, one per second; latency i * scale for request i = 0..100."""
    return [
        RequestRecord(
            contender=contender,
            request_id=f"r{i}",
            arrival=float(i),
            ttft=i * scale,
            e2e=i * scale * 10,
            output_tokens=tokens,
            tpot=i * scale / 100,
            accept_length=accept,
            phase="peak" if i % 2 else "valley",
        )
        for i in range(101)
    ]


def _report_inputs():
    records = (
        _records("no-spec", 0.01, 100)
        + _records("standalone-k2", 0.005, 100, accept=2.0)
        + _records("standalone-k4", 0.004, 100, accept=3.0)
        + _records("faser", 0.002, 100, accept=4.0)
    )
    windows = [
        WindowSample(name, float(t), tput, running=8, phase="peak" if t % 20 < 10 else "valley")
        for name, tput in [("no-spec", 100.0), ("faser", 300.0)]
        for t in range(0, 100, 5)
    ]
    return records, windows


def test_summary_percentiles_throughput_and_accept_length():
    records, windows = _report_inputs()
    by_name = {s.contender: s for s in report.summarize(records, windows)}
    base = by_name["no-spec"]
    assert base.requests == 101
    assert (base.ttft.p50, base.ttft.p90, base.ttft.p99) == pytest.approx((0.5, 0.9, 0.99))
    assert base.e2e.p99 == pytest.approx(9.9)
    assert base.tpot.p50 == pytest.approx(0.005)
    # 10100 tokens from first arrival (0 s) to last completion (100 + 10 s).
    assert base.duration == pytest.approx(110.0)
    assert base.throughput == pytest.approx(10100 / 110.0)
    assert base.accept_length is None
    assert by_name["faser"].accept_length == pytest.approx(4.0)
    assert base.phases["peak"].requests == 50 and base.phases["valley"].requests == 51
    assert base.phases["peak"].throughput == pytest.approx(100.0)
    # Peak = odd arrivals 1..99 (50 x 100 tokens), the last done at 99 + 9.9 s.
    assert base.phases["peak"].served_throughput == pytest.approx(5000 / (108.9 - 1.0))
    assert by_name["standalone-k2"].phases["peak"].throughput is None


def test_accept_length_pools_verify_steps():
    recs = [
        RequestRecord("s", "a", 0.0, 0.1, 1.0, 300, 0.01, accept_length=3.0),  # 100 steps
        RequestRecord("s", "b", 0.0, 0.1, 1.0, 100, 0.01, accept_length=1.0),  # 100 steps
    ]
    assert report.summarize(recs)[0].accept_length == pytest.approx(2.0)


def test_one_token_outputs_have_no_tpot():
    recs = [
        RequestRecord("s", "a", 0.0, 0.1, 0.1, 1, None),
        RequestRecord("s", "b", 0.0, 0.1, 1.0, 11, 0.09),
    ]
    summary = report.summarize(recs)[0]
    assert summary.tpot.p99 == pytest.approx(0.09)
    assert report.summarize(recs[:1])[0].tpot is None


def test_ratios_to_baseline_and_best_of_group(tmp_path):
    records, windows = _report_inputs()
    rep = report.build_report(
        records, windows, baseline="no-spec", groups={"best STANDALONE": ["standalone-k2", "standalone-k4"]}
    )
    # Equal token counts, so throughput is set by the last completion: 100 + 100 * scale * 10.
    assert rep.best_of == {"best STANDALONE": "standalone-k4"}
    faser = rep.ratios["faser"]
    assert faser["no-spec"].throughput == pytest.approx(110.0 / 102.0)
    assert faser["no-spec"].tpot_p50 == pytest.approx(0.2)
    assert faser["best STANDALONE"].reference == "standalone-k4"
    assert faser["best STANDALONE"].e2e_p99 == pytest.approx(0.5)
    assert rep.ratios["no-spec"]["no-spec"].throughput == pytest.approx(1.0)

    table = rep.markdown_table()
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 4  # header, separator, one row per contender
    names = [line.split("|")[1].strip() for line in lines[2:]]
    assert names == ["no-spec", "standalone-k2", "standalone-k4", "faser"]
    assert "best STANDALONE (standalone-k4)" in lines[0]
    assert f"{110.0 / 102.0:.2f}x" in lines[-1] and "0.20x" in lines[-1]

    # Per phase: served throughput against no-spec's and the best STANDALONE's in that
    # phase (spans 1 s .. 99 s + 10 * 99 * scale), then the mean window throughput.
    phases = rep.phase_table().strip().splitlines()
    assert phases[0].startswith("| phase | contender | requests | served tok/s |") and len(phases) == 2 + 2 * 4
    faser_peak = next(line for line in phases if line.startswith("| peak | faser |"))
    assert f"| {5000 / 99.98:.1f} | {107.9 / 99.98:.2f}x | {101.96 / 99.98:.2f}x | 300.0 |" in faser_peak
    k4_peak = next(line for line in phases if line.startswith("| peak | standalone-k4 |"))
    assert "x | - |" in k4_peak  # no window samples
    assert report.build_report(records[:101]).phase_table().count("| peak |") == 1

    data = json.loads(rep.write_json(tmp_path / "report.json").read_text())
    assert data["best_of"] == {"best STANDALONE": "standalone-k4"}
    assert len(data["summaries"]) == 4

    with pytest.raises(ValueError):
        report.build_report(records, baseline="missing")
    with pytest.raises(ValueError):
        report.build_report(records, groups={"g": ["standalone-k9"]})


def test_bursts_are_runs_of_peak_arrivals_and_the_cli_rebuilds_the_table(tmp_path, capsys):
    """Each run of consecutive peak-phase arrivals is a burst, reported apart (served
    throughput over its first arrival to its last completion, ratios to the baseline's
    and the best fixed length's same burst); ``python -m ...report`` rebuilds table.md
    from a run's gzipped requests."""
    phase_at = ["valley"] * 2 + ["peak"] * 3 + ["valley"] * 2 + ["peak"] * 4  # arrivals 0..10 s

    def run(contender, e2e):
        return [RequestRecord(contender, f"r{i}", float(i), 0.1, e2e, 100, 0.01, phase=ph)
                for i, ph in enumerate(phase_at)]  # fmt: skip

    records = run("no-spec", 2.0) + run("standalone-k1", 4.0) + run("standalone-k3", 3.0) + run("faser-ad", 1.0)
    rep = report.build_report(records, groups=report.fixed_length_groups(dict.fromkeys(r.contender for r in records)))
    faser = next(s for s in rep.summaries if s.contender == "faser-ad")
    assert [b.requests for b in faser.bursts] == [3, 4]
    # Burst 2: arrivals 7..10 s, the last done at 10 + e2e.
    assert faser.bursts[1].served_throughput == pytest.approx(400 / 4.0)
    lines = rep.burst_table().strip().splitlines()
    assert lines[0] == ("| burst | contender | requests | served tok/s | served vs no-spec | served vs standalone-k3 "
                        "| TTFT p50/p99 ms | TPOT p50/p99 ms |")  # fmt: skip
    assert len(lines) == 2 + 2 * 4
    assert f"| 2 | faser-ad | 4 | 100.0 | {5 / 4:.2f}x | {6 / 4:.2f}x | 100 / 100 |" in rep.burst_table()
    assert "Per burst:" in rep.markdown() and "Per load phase:" in rep.markdown()
    one_burst = [r for r in records if r.arrival < 7]
    single = report.build_report(one_burst)
    assert single.burst_table() == "" and "Per burst" not in single.markdown()

    path = tmp_path / "requests.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(asdict(r)) + "\n" for r in records)
    assert report.read_records(path) == records
    assert report.main([str(path)]) == 0
    assert capsys.readouterr().out == rep.markdown()
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "empty.jsonl")])


def test_report_plots_are_pngs(tmp_path):
    records, windows = _report_inputs()
    over_time = report.plot_over_time(records, windows, tmp_path / "time.png", peak_spans=[(0.0, 10.0)])
    summaries = report.summarize(records, windows)
    sweep = report.plot_rate_sweep({1.0: summaries, 2.0: summaries, 4.0: summaries}, tmp_path / "sweep.png")
    for path in (over_time, sweep):
        assert path.read_bytes()[:8] == PNG_MAGIC


# --- A/B lanes and the soak plan ---------------------------------------------


def test_gpu_lanes_deal_contenders_round_robin_and_keep_order(monkeypatch):
    import argparse
    import threading

    from faser_sglang.bench import ab
    from faser_sglang.bench.client import ReplayResult

    seen: list[tuple[str, str | None, str]] = []
    both_lanes_started = threading.Barrier(2, timeout=10)

    def fake_run_one(args, replays, name, gpu):
        seen.append((name, gpu, threading.current_thread().name))
        if name in ("no-spec", "standalone-k1"):  # each lane's first: passes only if the lanes overlap
            both_lanes_started.wait()
        return [ab.ContenderRun(name, ReplayResult([], [], float(i))) for i in range(len(replays))]

    monkeypatch.setattr(ab, "run_one", fake_run_one)
    names = ["no-spec", "standalone-k1", "adaptive", "standalone-k3", "faser", "faser-ad"]
    args = argparse.Namespace(contenders=names, gpus=["0", "1"])
    progress: list[list[str]] = []
    replays = ["main", "sweep"]  # run_one only counts them here
    runs = ab.run_contenders(args, replays, lambda done: progress.append([r.name for r in done[0]]))
    expected = ["no-spec", "standalone-k1", "standalone-k3", "faser", "faser-ad"]
    assert [[r.name for r in per_replay] for per_replay in runs] == [expected, expected]  # [replay][contender]
    assert [r.result.duration for r in runs[1]] == [1.0] * 5  # each contender's second replay
    lane = {name: gpu for name, gpu, _ in seen}
    assert lane == {"no-spec": "0", "standalone-k3": "0", "faser-ad": "0", "standalone-k1": "1", "faser": "1"}
    # After every contender, the finished ones in the given order (a later one waits for
    # those before it): each report is a prefix of the contender list, ending complete.
    assert len(progress) == 5 and progress[-1] == expected
    assert all(p == expected[: len(p)] for p in progress)


def test_soak_plan_mixes_sampling_and_aborts_and_is_seeded():
    from faser_sglang.bench import soak

    trace = traces.bursty(6.0, 10.0, 600.0, seed=3)
    pool = workloads.load("humaneval", n=20)
    plans = soak.plan_requests(trace, pool, abort_fraction=0.1, seed=3)
    assert plans == soak.plan_requests(trace, pool, abort_fraction=0.1, seed=3)
    assert len(plans) == len(trace.arrivals) > 1000
    aborted = [p for p in plans if p.abort]
    assert 0.07 < len(aborted) / len(plans) < 0.13
    assert {p.abort for p in aborted} == {"disconnect", "abort_request"}
    assert all("rid" in p.payload for p in aborted if p.abort == "abort_request")
    params = [p.payload["sampling_params"] for p in plans]
    greedy = sum(sp["temperature"] == 0 for sp in params)
    assert 0.4 < greedy / len(plans) < 0.6
    assert any(sp.get("n") == 2 for sp in params) and any("stop" in sp for sp in params)
    assert {sp["max_new_tokens"] for sp in params} >= {1, 256}


def test_soak_per_minute_percentiles():
    from faser_sglang.bench import soak

    outcomes = [soak.Outcome(i, arrival=float(i), abort=None, status="ok", e2e=float(i % 60), ttft=0.1,
                             output_tokens=10) for i in range(120)]  # fmt: skip
    outcomes.append(soak.Outcome(120, arrival=5.0, abort="disconnect", status="aborted"))
    rows = soak.per_minute(outcomes, duration=120.0)
    assert [r["completed"] for r in rows] == [60, 60]
    assert rows[0]["aborted"] == 1 and rows[1]["aborted"] == 0
    assert rows[0]["e2e_p50"] == pytest.approx(29.5)
    assert rows[0]["output_tokens"] == 600


def test_faser_ad_contenders_differ_only_in_the_schedule():
    from faser_sglang.bench import servers

    overlap = servers.contender("faser-ad", "D", 7, faser_ad_config="ad.json")
    sync = servers.contender("faser-ad-sync", "D", 7, faser_ad_config="ad.json")
    assert sync.args == (*overlap.args, "--disable-overlap-schedule") and sync.env == overlap.env == {"FASER_CONFIG": "ad.json"}
    with pytest.raises(ValueError, match="faser-ad-sync needs a FASER_CONFIG"):
        servers.contender("faser-ad-sync", "D", 7)


def test_faser_ad_variant_replaces_config_keys_and_rejects_typos(tmp_path):
    from faser_sglang.bench import servers

    base = tmp_path / "faser-ad.json"
    base.write_text(json.dumps({"policy": "adaptive", "catchup_horizon": 16}))
    c = servers.contender("faser-ad@draft_prefill=eager,catchup_horizon=4", "D", 7, faser_ad_config=str(base))
    assert c.name == "faser-ad@draft_prefill=eager,catchup_horizon=4"
    written = json.loads(Path(c.env["FASER_CONFIG"]).read_text())
    assert written == {"policy": "adaptive", "catchup_horizon": 4, "draft_prefill": "eager"}
    assert json.loads(base.read_text())["catchup_horizon"] == 16  # the base config is left as it was
    sync = servers.contender("faser-ad-sync@window=8", "D", 7, faser_ad_config=str(base))
    assert "--disable-overlap-schedule" in sync.args
    with pytest.raises(ValueError, match="unknown key.*draft_prefil"):
        servers.contender("faser-ad@draft_prefil=eager", "D", 7, faser_ad_config=str(base))
    with pytest.raises(ValueError, match="'draft_prefill' must be one of"):
        servers.contender("faser-ad@draft_prefill=sometimes", "D", 7, faser_ad_config=str(base))
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        servers.contender("faser-ad@eager", "D", 7, faser_ad_config=str(base))


def test_contenders_take_server_flags_of_their_own(tmp_path):
    from faser_sglang.bench import servers

    base = tmp_path / "faser-ad.json"
    base.write_text(json.dumps({"policy": "adaptive"}))
    name = "faser-ad@window=8+speculative-draft-attention-backend=triton+disable-overlap-schedule"
    c = servers.contender(name, "D", 7, faser_ad_config=str(base))
    plain = servers.contender("faser-ad", "D", 7, faser_ad_config=str(base))
    assert c.name == name
    assert c.args == (*plain.args, "--speculative-draft-attention-backend", "triton", "--disable-overlap-schedule")
    assert json.loads(Path(c.env["FASER_CONFIG"]).read_text())["window"] == 8
    assert servers.contender("standalone-k3+cuda-graph-max-bs=8", "D", 7).args[-2:] == ("--cuda-graph-max-bs", "8")
    steady = servers.steady_contender("faser-k3+speculative-draft-attention-backend=triton", "D", 7, tmp_path)
    assert steady.args[-2:] == ("--speculative-draft-attention-backend", "triton")
    assert "FASER_CONFIG" in steady.env
    for bad in ("faser+--double-dash=1", "faser+Flag=1", "faser+flag="):
        with pytest.raises(ValueError, match="is not a server flag"):
            servers.contender(bad, "D", 7)


def test_contenders_take_environment_variables_of_their_own(tmp_path):
    from faser_sglang.bench import servers

    c = servers.contender("no-spec+env:FASER_HOST_PREFILL_PLAN=1+cuda-graph-max-bs=8", "D", 7)
    assert c.env == {"FASER_HOST_PREFILL_PLAN": "1"} and c.args[-2:] == ("--cuda-graph-max-bs", "8")
    base = tmp_path / "faser-ad.json"
    base.write_text(json.dumps({"policy": "adaptive"}))
    c = servers.contender("faser-ad+env:FASER_HOST_PREFILL_PLAN=1", "D", 7, faser_ad_config=str(base))
    assert set(c.env) == {"FASER_CONFIG", "FASER_HOST_PREFILL_PLAN"}
    for bad in ("no-spec+env:lower=1", "no-spec+env:NAME", "no-spec+env:=1"):
        with pytest.raises(ValueError, match="is not env:NAME=VALUE"):
            servers.contender(bad, "D", 7)


def test_launch_retries_on_a_port_taken_in_between(monkeypatch, tmp_path):
    """A port picked free can be taken before the server binds it (another server
    starting at the same time); the server then logs it and hangs unready. The launch
    is tried again on a fresh port; any other failure is not retried."""
    from faser_sglang.bench import servers

    started: list[int] = []
    closed: list[int] = []

    class FakeServer:
        def __init__(self, n: int):
            self.n = n

        def close(self):
            closed.append(self.n)

    def start(model_path, args, env, log_dir):
        started.append(len(started))
        return FakeServer(started[-1])

    outcomes = [servers.PortInUse("bind"), None]

    def wait_ready(server, timeout):
        outcome = outcomes[server.n]
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(servers, "_start", start)
    monkeypatch.setattr(servers, "_wait_ready", wait_ready)
    server = servers.launch("m")
    assert server.n == 1 and closed == [0]

    started.clear()
    closed.clear()
    outcomes[:] = [servers.PortInUse("bind")] * servers.PORT_ATTEMPTS
    with pytest.raises(servers.PortInUse):
        servers.launch("m")
    assert closed == list(range(servers.PORT_ATTEMPTS))

    started.clear()
    closed.clear()
    outcomes[:] = [RuntimeError("server exited")]
    with pytest.raises(RuntimeError, match="exited"):
        servers.launch("m")
    assert closed == [0] and len(started) == 1


def test_wait_ready_reports_a_port_in_use_from_the_log(tmp_path):
    from faser_sglang.bench import servers

    log = tmp_path / "server.log"
    log.write_text("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): address already in use\n")
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(servers.PortInUse, match="could not bind"):
            servers._wait_ready(servers.Server("http://127.0.0.1:1", process, log), timeout=10)
    finally:
        process.kill()
        process.wait()
