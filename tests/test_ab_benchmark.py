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
            "--max-new-tokens", "24",
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    assert rc == 0
    for name in ("report.json", "table.md", "trace.png", "over_time.png", "run.json"):
        assert (out / name).stat().st_size > 0, name
    run = json.loads((out / "run.json").read_text())
    # Greedy speculation is lossless: CPU float32 runs must match exactly.
    assert run["greedy_mismatches_vs_no_spec"] == {"no-spec-control": 0, "standalone-k3": 0, "faser": 0}
    assert "adaptive" in run["not_run"]
    table = (out / "table.md").read_text()
    assert "| faser |" in table and "| no-spec-control |" in table
    assert "best STANDALONE (standalone-k3)" in table
    report = json.loads((out / "report.json").read_text())
    faser = next(s for s in report["summaries"] if s["contender"] == "faser")
    assert faser["accept_length"] is not None and faser["accept_length"] >= 1.0
    assert os.path.getsize(out / "over_time.png") > 1000


def test_rate_sweep_reuses_a_poisson_main_run_and_replays_other_rates(monkeypatch):
    from argparse import Namespace

    replayed: list[float] = []

    def fake_run_contenders(args, trace, reqs):
        replayed.append(trace)
        return [f"run@{trace}"]

    monkeypatch.setattr(ab, "build_trace", lambda args, rate=None: rate)
    monkeypatch.setattr(ab, "requests_for", lambda trace, args: [])
    monkeypatch.setattr(ab, "run_contenders", fake_run_contenders)
    monkeypatch.setattr(ab, "records", lambda run, trace, reqs: [run])
    monkeypatch.setattr(ab.rep, "summarize", lambda recs: recs)

    poisson = Namespace(trace="poisson", rate=6.0, sweep_rates=[12.0, 6.0, 2.0])
    sweep = ab.rate_sweep(poisson, "main", [], ["main-run"])
    assert list(sweep) == [2.0, 6.0, 12.0] and sweep[6.0] == ["main-run"]
    assert replayed == [12.0, 2.0]  # the main run's rate is not replayed
    bursty = Namespace(trace="bursty", rate=6.0, sweep_rates=[6.0])
    assert ab.rate_sweep(bursty, "main", [], ["main-run"]) == {6.0: ["run@6.0"]}
    assert ab.rate_sweep(Namespace(trace="poisson", rate=6.0, sweep_rates=[]), "main", [], []) == {}
