"""The A/B benchmark end to end on CPU with tiny models: a short bursty trace,
no-spec (and its control rerun) vs STANDALONE vs FASER, report files and the
greedy-equality check."""

from __future__ import annotations

import json
import os

import pytest

from faser_sglang.bench import ab
from server_utils import CPU_SERVER_FLAGS

pytestmark = pytest.mark.server


def test_ab_quick_run_writes_report(tiny_models, tmp_path, cpu_server_env):
    out = tmp_path / "ab"
    rc = ab.main(
        [
            "--target", str(tiny_models.target),
            "--draft", str(tiny_models.draft),
            "--out", str(out),
            "--k-max", "4",
            "--contenders", "no-spec", "no-spec-control", "standalone-k3", "adaptive", "faser",
            "--rate", "1.5", "--peak-to-valley", "6", "--duration", "12",
            "--burst-min", "2", "--burst-max", "4",
            "--sweep-rates", "3",
            "--max-new-tokens", "24",
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    assert rc == 0
    # Each contender's one server also replayed the Poisson sweep point (cache flushed between).
    for name in ("report.json", "table.md", "trace.png", "over_time.png", "run.json", "requests.jsonl",
                 "rate_sweep.png", "sweep.json"):
        assert (out / name).stat().st_size > 0, name
    sweep = json.loads((out / "sweep.json").read_text())
    assert [s["contender"] for s in sweep["3.0"]] == ["no-spec", "no-spec-control", "standalone-k3", "faser"]
    # Each server's batch lines are kept; FASER's also carry its length histogram.
    assert "Decode batch" in (out / "server-logs" / "no-spec.log").read_text()
    assert "FASER" in (out / "server-logs" / "faser.log").read_text()
    # Every speculative server warms SGLang's allocation kernel at startup (baseline_warmup.py;
    # nothing to compile off CUDA); no-spec has none to warm.
    warm = "FASER FASER_WARM_SPEC_KERNELS: STANDALONE server, 0 launches"
    assert warm in (out / "server-logs" / "standalone-k3.log").read_text()
    assert "FASER_WARM_SPEC_KERNELS" not in (out / "server-logs" / "no-spec.log").read_text()
    run = json.loads((out / "run.json").read_text())
    # Greedy speculation is lossless: CPU float32 runs must match exactly.
    assert run["greedy_mismatches_vs_no_spec"] == {"no-spec-control": 0, "standalone-k3": 0, "faser": 0}
    assert "adaptive" in run["not_run"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 4 * run["requests"] and {"arrival", "e2e", "phase"} <= set(records[0])
    table = (out / "table.md").read_text()
    assert "| faser |" in table and "| no-spec-control |" in table
    assert "best STANDALONE (standalone-k3)" in table
    report = json.loads((out / "report.json").read_text())
    faser = next(s for s in report["summaries"] if s["contender"] == "faser")
    assert faser["accept_length"] is not None and faser["accept_length"] >= 1.0
    assert os.path.getsize(out / "over_time.png") > 1000


def test_sweep_replays_each_other_rate_once_and_reuses_a_poisson_main_run(monkeypatch):
    from argparse import Namespace

    monkeypatch.setattr(ab, "build_trace", lambda args, rate=None: f"trace@{rate}")
    monkeypatch.setattr(ab, "requests_for", lambda trace, args: [trace])
    monkeypatch.setattr(ab, "records", lambda run, trace, reqs: [(run, trace)])
    monkeypatch.setattr(ab.rep, "summarize", lambda recs: recs)

    poisson = Namespace(trace="poisson", rate=6.0, sweep_rates=[12.0, 6.0, 2.0, 12.0])
    replays = ab.plan_replays(poisson, "main", ["r"])
    assert [r.rate for r in replays] == [None, 2.0, 12.0]  # 6 is the main run itself
    runs = [[f"run{i}"] for i in range(len(replays))]
    sweep = ab.rate_sweep(poisson, replays, runs)
    assert sweep == {2.0: [("run1", "trace@2.0")], 6.0: [("run0", "main")], 12.0: [("run2", "trace@12.0")]}

    bursty = Namespace(trace="bursty", rate=6.0, sweep_rates=[6.0])
    replays = ab.plan_replays(bursty, "main", ["r"])
    assert [r.rate for r in replays] == [None, 6.0]  # a bursty main run is no sweep point
    assert ab.rate_sweep(bursty, replays, [["run0"], ["run1"]]) == {6.0: [("run1", "trace@6.0")]}
    none = Namespace(trace="poisson", rate=6.0, sweep_rates=[])
    assert ab.rate_sweep(none, ab.plan_replays(none, "main", []), [[]]) == {}


def test_no_spec_runs_first_and_is_required(capsys):
    assert ab.baseline_first(["faser-ad", "no-spec", "standalone-k3"]) == ["no-spec", "faser-ad", "standalone-k3"]
    assert "no-spec runs first" in capsys.readouterr().out
    assert ab.baseline_first(["no-spec", "faser"]) == ["no-spec", "faser"]
    with pytest.raises(SystemExit, match="must include no-spec"):
        ab.baseline_first(["faser", "standalone-k3"])


def test_ab_with_sampled_requests(tiny_models, tmp_path, cpu_server_env, capsys):
    """--temperature: every request samples; outputs are not compared with no-spec."""
    out = tmp_path / "ab"
    rc = ab.main(
        [
            "--target", str(tiny_models.target), "--draft", str(tiny_models.draft), "--out", str(out),
            "--k-max", "4", "--contenders", "no-spec", "faser",
            "--rate", "1.5", "--peak-to-valley", "6", "--duration", "8", "--burst-min", "2", "--burst-max", "4",
            "--max-new-tokens", "24", "--temperature", "0.8", "--top-p", "0.9",
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    assert rc == 0
    run = json.loads((out / "run.json").read_text())
    assert run["sampling"] == {"temperature": 0.8, "top_p": 0.9, "ignore_eos": True}
    assert run["greedy_mismatches_vs_no_spec"] == {}
    assert "outputs are not compared with no-spec" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    faser = next(s for s in report["summaries"] if s["contender"] == "faser")
    assert faser["accept_length"] is not None and faser["accept_length"] >= 1.0


def test_sampling_params_and_their_checks():
    assert ab.sampling_params(0.0, 0.9) == ab.GREEDY
    assert ab.sampling_params(0.7, 0.95) == {"temperature": 0.7, "top_p": 0.95, "ignore_eos": True}
    for bad in (["--temperature", "-1"], ["--temperature", "0.5", "--top-p", "0"]):
        with pytest.raises(SystemExit):
            ab.main(["--target", "t", "--draft", "d", "--out", "/tmp/unused", *bad])


def test_quick_bench_keeps_each_servers_log(tiny_models, tmp_path, cpu_server_env):
    """``bench.quick --log-dir`` keeps every contender's server log (the GPU kernel
    warm-up runs it, and a server that failed there is named only by its log)."""
    from faser_sglang.bench import quick

    logs = tmp_path / "logs"
    rc = quick.main(
        [
            "--target", str(tiny_models.target),
            "--draft", str(tiny_models.draft),
            "--contenders", "no-spec", "faser",
            "--concurrency", "2", "--num-prompts", "2", "--max-new-tokens", "4",
            "--k-max", "2",
            "--log-dir", str(logs),
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    assert rc == 0
    texts = [p.read_text() for p in sorted(logs.glob("sglang-*.log"))]
    assert len(texts) == 2 and sum("speculative_algorithm='FASER'" in t for t in texts) == 1


def test_warm_up_walks_every_power_of_two_up_to_the_running_cap(monkeypatch):
    from argparse import Namespace

    from faser_sglang.bench.client import ReplayResult
    from faser_sglang.bench.workloads import Request

    sizes = []

    def fake_replay(base_url, workload, arrivals, sampling):
        assert arrivals == [0.0] * len(workload) and {r.max_new_tokens for r in workload} == {ab.WARM_UP_TOKENS}
        sizes.append(len(workload))
        return ReplayResult([], [], 0.0)

    monkeypatch.setattr(ab, "replay", fake_replay)
    reqs = [Request(f"r{i}", f"prompt {i}", 256) for i in range(5)]  # fewer prompts than the cap: reused
    ab.warm_up("http://x", reqs, dict(ab.GREEDY), 24)
    assert sizes == [1, 2, 4, 8, 16, 24]

    args = Namespace(warm_up_batch=0, server_args=["--dtype", "bfloat16", "--max-running-requests", "128"])
    assert ab.warm_up_batch(args) == 128
    assert ab.warm_up_batch(Namespace(warm_up_batch=0, server_args=[])) == 4
    assert ab.warm_up_batch(Namespace(warm_up_batch=32, server_args=["--max-running-requests", "128"])) == 32
    with pytest.raises(SystemExit):
        ab.main(["--target", "t", "--draft", "d", "--out", "/tmp/x", "--warm-up-batch", "-1"])
