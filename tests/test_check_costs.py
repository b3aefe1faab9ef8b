"""scripts/check_costs.py: a cost model against the steps a server traced."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import H200_14B, load_script
from faser_sglang.spec_worker.adaptive import CostKey, write_cost_entry


@pytest.fixture(scope="module")
def script():
    return load_script("check_costs")


def record(draft_lens, seq_len, lag, seconds, ended, phases=True):
    bs = len(draft_lens)
    rec = {
        "step": 0,
        "rids": [f"r{i}" for i in range(bs)],
        "seq_lens": [seq_len] * bs,
        "draft_kv_lens": [seq_len - lag] * bs,  # catch-up = lag + 1 tokens
        "draft_lens": list(draft_lens),
        "num_accepted": [0] * bs,
        "seconds": seconds,
        "catchup_piece_tokens": 128,
    }
    if ended is not None:
        rec["ended"] = ended
    if phases:
        rec |= {"policy_seconds": 0.001, "draft_seconds": seconds / 4, "verify_seconds": seconds / 2}
    return rec


def predicted(draft_lens, seq_len, lag):
    bs = len(draft_lens)
    return H200_14B.step_time(draft_lens, [seq_len] * bs, [lag + 1] * bs, 128)


def test_table_reports_where_the_model_errs(script, tmp_path, capsys):
    """Plain steps of 4 requests as predicted, drafting steps of 40 requests (a dozen
    drafting, catching up 150-token prompts) at twice the prediction, 5 ms between
    steps; the drafting steps' records arrive after the next step's (as under overlap)."""
    costs = tmp_path / "costs.json"
    write_cost_entry(costs, CostKey("NVIDIA H200", "t", "d", "flashinfer", "bfloat16"), H200_14B)
    plain, drafting = [0] * 4, [3] * 12 + [0] * 28
    records, t = [], 0.0
    for i in range(20):
        lens, lag, factor = (drafting, 149, 2.0) if i % 2 else (plain, 0, 1.0)
        seconds = factor * predicted(lens, 300, lag)
        t += 0.005 + seconds
        records.append(record(lens, 300, lag, seconds, t))
    for i in range(1, 20, 2):  # each drafting step written after the plain step that follows it
        if i + 1 < 20:
            records[i], records[i + 1] = records[i + 1], records[i]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))

    script.main(["--costs", str(costs), "--trace", str(trace), "--steps-csv", str(tmp_path / "steps.csv")])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ") and "steps |" not in line]
    rows = {line.split(" | ")[2]: line.split(" | ") for line in lines}
    assert rows["plain"][0] == "| 2-4" and rows["plain"][1] == "10" and rows["plain"][5] == "1.00"
    assert rows["drafting"][0] == "| 33-64" and rows["drafting"][5] == "2.00"
    assert rows["drafting"][6] == "100.0%" and rows["drafting"][7] == "150"  # MAPE; catch-up tokens
    assert rows["plain"][-1] == "5.00 |" and rows["drafting"][-1] == "5.00 |"  # gap before a step, ms
    assert rows["plain"][8] == "1.00" and rows["plain"][11] == "-"  # policy ms; no accept phase traced
    with open(tmp_path / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 20 and [float(s["ended"]) for s in steps] == sorted(float(s["ended"]) for s in steps)
    assert {int(s["catchup_tokens"]) for s in steps if int(s["drafts"])} == {12 * 150}


def test_older_traces_without_step_ends_have_no_gaps(script):
    steps = script.check(H200_14B, [record([0, 2], 100, 0, 0.02, None, phases=False)] * 3)
    assert [s.gap for s in steps] == [None] * 3
    assert script.table(steps).splitlines()[-1].endswith("| - |")


def test_bad_arguments_are_named(script, tmp_path):
    costs = tmp_path / "costs.json"
    write_cost_entry(costs, CostKey("NVIDIA H200", "t", "d", "flashinfer", "bfloat16"), H200_14B)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit):
        script.main(["--costs", str(costs), "--trace", str(empty)])
    with pytest.raises(SystemExit):
        script.main(["--costs", str(costs), "--trace", str(empty), "--key", "3"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"seconds": 0.01}) + "\n")
    with pytest.raises(ValueError, match="trace record lacks"):
        script.main(["--costs", str(costs), "--trace", str(bad)])
