"""The per-phase step profile: the trace summary on a synthetic GPU trace, and
scripts/profile_step.py against a real CPU server (FASER's ranges in SGLang's profile)."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from conftest import load_script
from faser_sglang.bench import step_profile
from server_utils import CPU_SERVER_FLAGS

HOST, DEVICE = 1, 7  # thread ids


def x(cat: str, name: str, start: float, end: float, tid: int = HOST, corr: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": end - start, "pid": 1, "tid": tid}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


def gpu_trace() -> list[dict]:
    """Two steps in microseconds: a drafting step with a chain [0, 1000], a plain one [2000, 2500]."""
    return [
        x("user_annotation", "faser.decode bs=2", 0, 1000),
        x("user_annotation", "faser.settle", 0, 10),
        x("user_annotation", "faser.policy", 10, 100),
        x("user_annotation", "faser.draft", 100, 600),
        x("user_annotation", "faser.draft.catchup", 110, 300),
        x("cpu_op", "aten::mm", 120, 200),
        x("cpu_op", "aten::empty", 130, 140),  # nested: counted in aten::mm
        x("cuda_runtime", "cudaLaunchKernel", 150, 160, corr=1),
        x("user_annotation", "faser.draft.chain", 300, 590),
        x("cuda_runtime", "cudaGraphLaunch", 350, 380, corr=2),
        x("user_annotation", "faser.verify", 600, 900),
        x("cuda_runtime", "cudaStreamSynchronize", 610, 850),
        x("cuda_runtime", "cudaMemcpyAsync", 860, 870, corr=3),
        x("user_annotation", "faser.accept", 900, 990),
        x("user_annotation", "faser.decode bs=2", 2000, 2500),
        x("user_annotation", "faser.settle", 2000, 2010),
        x("user_annotation", "faser.policy", 2010, 2050),
        x("user_annotation", "faser.plain", 2050, 2400),
        x("user_annotation", "sglang.other", 2100, 2200),  # not FASER's: ignored
        x("kernel", "gemm", 400, 700, tid=DEVICE, corr=1),
        x("kernel", "graph_node_a", 700, 1100, tid=DEVICE, corr=2),
        x("kernel", "graph_node_b", 1000, 1500, tid=DEVICE, corr=2),  # overlaps a: busy counts it once
        x("gpu_memcpy", "Memcpy DtoH", 1500, 1510, tid=DEVICE, corr=3),
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    ]


def test_phases_are_measured_from_host_calls_and_their_device_work():
    first, second = step_profile.steps(step_profile.parse(gpu_trace()))
    assert (first.kind, first.batch_size, second.kind) == ("drafting/catchup+chain", 2, "plain")
    assert first.period_ms == pytest.approx(2.0) and second.period_ms is None
    assert first.device_busy_ms == pytest.approx(1.11)  # [400, 1510], overlaps once
    catchup, chain, draft, verify = (first.phases[p] for p in ("draft.catchup", "draft.chain", "draft", "verify"))
    assert catchup == pytest.approx(
        {"host_ms": 0.19, "ops_ms": 0.08, "runtime_ms": 0.0, "python_ms": 0.11, "sync_ms": 0.0,
         "copy_ms": 0.0, "launches": 1, "graphs": 0, "graph_ms": 0.0, "gpu_ms": 0.3}
    )  # fmt: skip
    assert chain["runtime_ms"] == pytest.approx(0.03) and chain["graphs"] == 1
    assert chain["graph_ms"] == pytest.approx(0.03)  # the launch call's host time
    assert chain["gpu_ms"] == pytest.approx(0.9)  # both graph nodes, by correlation
    assert draft["launches"] == 2 and draft["gpu_ms"] == pytest.approx(1.2)  # holds both sub-phases
    assert verify["sync_ms"] == pytest.approx(0.24) and verify["copy_ms"] == pytest.approx(0.01)
    assert verify["launches"] == 1 and verify["gpu_ms"] == pytest.approx(0.01)
    assert first.ops["draft.catchup"] == pytest.approx({"aten::mm": 0.08})  # outermost only
    # The catch-up's gemm starts at 400 us, the verify's copy at 1500, the copy ends at 1510.
    assert first.path == pytest.approx({"draft_start": 0.4, "target_start": 1.5, "device_end": 1.51})
    assert second.path == {}  # a plain step that issued no device work
    assert set(second.phases) == {"settle", "policy", "plain"}


def test_summary_groups_steps_and_reads_gzipped_traces(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    last = [x("user_annotation", "faser.decode bs=2", 3000, 3100), x("user_annotation", "faser.draft", 3010, 3020)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": gpu_trace() + last}, f)
    groups = step_profile.summarize(step_profile.steps(step_profile.parse(step_profile.load_events(path))))
    # The trace's last step (its device work may outlast the profile) is left out.
    assert [(g["kind"], g["steps"]) for g in groups] == [("drafting/catchup+chain", 1), ("plain", 1)]
    assert groups[0]["phases"]["draft.chain"]["graphs"] == 1 and groups[0]["phases"]["draft"]["steps"] == 1
    assert groups[0]["top_ops_ms"]["draft.catchup"] == [["aten::mm", pytest.approx(0.08)]]
    md = step_profile.markdown(groups, title="t")
    assert "### drafting/catchup+chain, batch 2 (1 steps)" in md and "| &nbsp;&nbsp;draft.chain | 0.29 |" in md
    assert "period 2.00 ms" in md and "period 1.00 ms" in md
    assert "critical path, ms from the step's start: the draft's work starts 0.40, the target's forward starts 1.50" in md


def test_the_module_prints_the_tables_of_saved_traces(tmp_path, capsys):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": gpu_trace()}, f)
    assert step_profile.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## t.trace.json.gz") and "### drafting/catchup+chain, batch 2 (1 steps)" in out


def test_step_kinds_and_the_synchronous_loops_second_settle():
    """A synchronous server settles a step's acceptance at its end: both settle ranges
    count. A step whose drafts all stop at the first is ``drafting/one``; one that took
    the verify path without drafts (logprobs) is ``verify/no-drafts``."""
    events = [
        x("user_annotation", "faser.decode bs=1", 0, 100),
        x("user_annotation", "faser.settle", 0, 5),
        x("user_annotation", "faser.draft", 10, 40),
        x("user_annotation", "faser.draft.catchup", 10, 30),
        x("user_annotation", "faser.draft.first", 30, 40),
        x("user_annotation", "faser.verify", 40, 80),
        x("user_annotation", "faser.accept", 80, 85),
        x("user_annotation", "faser.settle", 85, 95),
        x("user_annotation", "faser.accept", 95, 100),
        x("user_annotation", "faser.decode bs=1", 200, 300),
        x("user_annotation", "faser.draft", 210, 211),
        x("user_annotation", "faser.verify", 211, 290),
    ]
    one, logprobs = step_profile.steps(step_profile.parse(events))
    assert (one.kind, logprobs.kind) == ("drafting/one", "verify/no-drafts")
    assert one.phases["settle"]["host_ms"] == pytest.approx(0.015) and one.phases["accept"]["host_ms"] == pytest.approx(0.01)
    assert one.phases["draft.first"]["host_ms"] == pytest.approx(0.01)


def test_a_step_drafted_ahead_and_its_ahead_phase():
    """A step the step before drafted takes its drafts (``draft.ahead``) and, after its
    accept, queues the next step's chain (``ahead``), then builds its result (``accept``)."""
    events = [
        x("user_annotation", "faser.decode bs=3", 0, 100),
        x("user_annotation", "faser.policy", 0, 10),
        x("user_annotation", "faser.draft", 10, 14),
        x("user_annotation", "faser.draft.ahead", 10, 13),
        x("user_annotation", "faser.verify", 14, 60),
        x("user_annotation", "faser.accept", 60, 70),
        x("user_annotation", "faser.ahead", 70, 95),
        x("user_annotation", "faser.accept", 95, 100),
    ]
    (step,) = step_profile.steps(step_profile.parse(events))
    assert step.kind == "drafting/ahead"
    assert step.phases["ahead"]["host_ms"] == pytest.approx(0.025)
    assert step.phases["accept"]["host_ms"] == pytest.approx(0.015)  # both accept ranges


def test_unprofiled_period_reads_the_second_whole_interval_at_the_batch_size(tmp_path):
    """SGLang's decode log lines after the call: the first one at the batch size may
    have begun before the batch was steady; the second one gives the period, from its
    accept length (1 without speculation) and generation throughput."""
    script = load_script("profile_step")
    spec = [
        "Decode batch, #running-req: 3, #token: 90, token usage: 0.00, accept len: 2.00, accept rate: 0.33, "
        "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0",
        "Decode batch, #running-req: 4, #token: 99, token usage: 0.00, accept len: 2.50, accept rate: 0.50, "
        "cuda graph: True, gen throughput (token/s): 400.00, #queue-req: 0",
        "Decode batch, #running-req: 4, #token: 99, token usage: 0.00, accept len: 2.00, accept rate: 0.33, "
        "cuda graph: True, gen throughput (token/s): 500.00, #queue-req: 0",
    ]
    plain = ["Decode batch, #running-req: 2, #token: 9, token usage: 0.00, cuda graph: True, "
             "gen throughput (token/s): 50.00, #queue-req: 0"] * 2  # fmt: skip
    early = "Decode batch, #running-req: 4, #token: 9, cuda graph: True, gen throughput (token/s): 1.00, #q"

    def period(lines: list[str], size: int) -> float | None:
        log = tmp_path / "server.log"
        log.write_text(f"[t] {early}\n")  # logged before the call: not read

        def append_later() -> None:
            time.sleep(0.3)
            with log.open("a") as f:
                f.writelines(f"[t] {line}\n" for line in lines)

        writer = threading.Thread(target=append_later)
        writer.start()
        try:
            return script.unprofiled_period_ms(log, size, timeout=2)
        finally:
            writer.join()

    assert period(spec, 4) == pytest.approx(1000 * 4 * 2.0 / 500)  # 16 ms: the second line at 4 requests
    assert period(plain, 2) == pytest.approx(1000 * 2 / 50)  # no speculation: one token per step
    assert period(spec, 8) is None  # no line at that batch size


def test_profile_step_refuses_a_profile_without_host_events(tmp_path, capsys):
    script = load_script("profile_step")
    with pytest.raises(SystemExit):
        script.main(["--target", "T", "--draft", "D", "--out", str(tmp_path), "--activities", "GPU"])
    assert "must include CPU" in capsys.readouterr().err


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_profile_step_records_every_phase_of_a_live_server(tiny_models, cpu_server_env, tmp_path, temperature):
    """Greedy and sampled requests (a sampled chain), the same phases and no
    boolean-mask indexing in either."""
    script = load_script("profile_step")
    out = tmp_path / "out"
    script.main(["--target", str(tiny_models.target), "--draft", str(tiny_models.draft), "--out", str(out),
                 "--contenders", "faser-k3", "--concurrency", "2", "--steps", "6", "--activities", "CPU",
                 "--max-new-tokens", "1000", "--temperature", str(temperature),
                 "--server-args", " ".join(CPU_SERVER_FLAGS)])  # fmt: skip
    report = json.loads((out / "steps.json").read_text())
    (group,) = report["profiles"]["faser-k3"]["2"]
    assert report["unprofiled_period_ms"]["faser-k3"]["2"] > 0  # from the server's decode log
    # Fixed lengths, a draft that disagrees often: each row lags at most one token, so
    # the chain feeds every catch-up.
    assert (group["kind"], group["batch_size"]) == ("drafting/chain", 2) and group["steps"] >= 5
    assert list(group["phases"]) == ["settle", "policy", "draft", "draft.chain", "verify", "accept"]
    assert "drafting/chain, batch 2" in (out / "steps.md").read_text()
    trace = step_profile.load_events(out / "faser-k3-c2-TP-0.trace.json.gz")
    # No boolean-mask indexing in a decode step: its nonzero waits for the GPU there.
    decode = [e for e in trace if e.get("cat") == "user_annotation" and e["name"].startswith("faser.decode")]
    assert decode and not [
        op for op in trace if op.get("cat") == "cpu_op" and op["name"] == "aten::nonzero"
        and any(d["tid"] == op["tid"] and d["ts"] <= op["ts"] <= d["ts"] + d["dur"] for d in decode)
    ]  # fmt: skip
    for step in step_profile.steps(step_profile.parse(trace)):  # nested and in order, step by step
        ph = {name: m["host_ms"] for name, m in step.phases.items()}
        assert ph["draft"] >= ph.get("draft.catchup", 0.0) + ph["draft.chain"]
        assert step.host_ms >= ph["settle"] + ph["policy"] + ph["draft"] + ph["verify"] + ph["accept"]
        assert step.period_ms is None or step.period_ms >= step.host_ms
