"""The log readers behind the scheduler diagnosis: prefill intervals from server logs,
and the event-loop profile from py-spy raw stacks."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from conftest import load_script

PREFILL = (
    "[2026-12-02 10:00:0{i}] Prefill batch, #new-seq: 1, #new-token: {tokens}, #cached-token: 0, "
    "token usage: 0.01, #running-req: 3, #queue-req: 0, input throughput (token/s): {rate}\n"
)


@pytest.fixture(scope="module")
def gaps():
    return load_script("prefill_gaps")


@pytest.fixture(scope="module")
def spy():
    return load_script("spy_summary")


def test_prefill_interval_is_new_tokens_over_input_throughput(gaps):
    log = PREFILL.format(i=0, tokens=100, rate=5.0)  # first line: the time since idle, left out
    log += PREFILL.format(i=1, tokens=100, rate=10000.0)  # 10 ms
    log += "[2026-12-02 10:00:02] Decode batch, #running-req: 4, gen throughput (token/s): 50.0\n"
    log += PREFILL.format(i=3, tokens=300, rate=6000.0)  # 50 ms
    log += PREFILL.format(i=4, tokens=7, rate=0.00)  # no throughput: left out
    assert gaps.intervals_ms(log) == pytest.approx([10.0, 50.0])


def test_prefill_table_gives_percentiles_and_marks_short_logs(gaps, tmp_path: Path):
    full = tmp_path / "server-0.log"
    full.write_text("".join(PREFILL.format(i=0, tokens=i + 1, rate=1000.0) for i in range(41)))  # 2..41 ms
    short = tmp_path / "server-1.log"
    short.write_text(PREFILL.format(i=0, tokens=10, rate=1000.0) * 3)
    rows = gaps.table([full, short]).splitlines()
    p5, p10, p25, p50 = (float(x) for x in rows[2].split("|")[3:7])
    assert rows[2].startswith("| server-0.log | 40 |")
    assert (p5, p50) == pytest.approx((3.0, 21.5), abs=0.2) and p5 < p10 < p25 < p50
    assert rows[3] == "| server-1.log | 2 | - | - | - | - |"


RAW = """\
<module> (/s/launch_server.py:10);run_scheduler_process (/s/scheduler.py:40);dispatch_event_loop (/s/scheduler.py:4795);Scheduler.event_loop_overlap (/s/scheduler.py:1763);Scheduler.run_batch (/s/scheduler.py:3594);forward_batch_generation (/f/worker.py:128) 30
<module> (/s/launch_server.py:10);run_scheduler_process (/s/scheduler.py:40);dispatch_event_loop (/s/scheduler.py:4795);Scheduler.event_loop_overlap (/s/scheduler.py:1773);pop_and_process (/s/scheduler.py:1725);synchronize (/t/streams.py:88) 60
<module> (/s/launch_server.py:10);run_scheduler_process (/s/scheduler.py:40);dispatch_event_loop (/s/scheduler.py:4795);Scheduler.event_loop_overlap (/s/scheduler.py:1732);recv_requests (/s/io.py:5) 10
_bootstrap (/p/threading.py:1);run (/s/watchdog.py:3);sleep (/p/time.py:1) 500
"""


def test_spy_summary_keeps_the_event_loop_and_shares_by_function(spy, tmp_path: Path):
    total, inclusive, own = spy.shares(spy.loop_stacks(RAW))
    assert total == 100  # the watchdog thread's samples are not the loop's
    assert inclusive["Scheduler.event_loop_overlap (scheduler.py)"] == 100
    assert inclusive["Scheduler.run_batch (scheduler.py)"] == 30
    assert own["synchronize (streams.py)"] == 60 and own["Scheduler.event_loop_overlap (scheduler.py)"] == 0
    path = tmp_path / "spy-7.txt"
    path.write_text(RAW)
    path.with_suffix(".cmd").write_text("python -m sglang.launch_server --speculative-algorithm FASER --x 1")
    text = spy.report(path)
    assert text.startswith("### spy-7.txt: faser, 100 event-loop samples")
    assert "| synchronize (streams.py) | 60.0 | 60.0 |" in text


def test_spy_summary_within_a_function_shares_out_its_samples(spy, tmp_path: Path):
    nested = RAW.replace("forward_batch_generation (/f/worker.py:128) 30",
                         "_prefill (/f/worker.py:190);forward_batch_generation (/t/tp_worker.py:9);plan (/fi/prefill.py:3391) 30")  # fmt: skip
    stacks = spy.loop_stacks(nested, within=("_prefill", "forward_batch_generation"))
    assert stacks == [(["forward_batch_generation (tp_worker.py)", "plan (prefill.py)"], 30)]
    assert spy.loop_stacks(nested, within=("_decode", "forward_batch_generation")) == []
    path = tmp_path / "spy-8.txt"
    path.write_text(nested)
    text = spy.report(path, within=("forward_batch_generation",))
    assert text.startswith("### spy-8.txt: ?, 30 event-loop samples within forward_batch_generation")
    assert "| plan (prefill.py) | 100.0 | 100.0 |" in text


def test_spy_contender_names(spy):
    assert spy.contender("python -m sglang.launch_server --model-path m") == "no-spec"
    cmd = "x --speculative-algorithm STANDALONE --speculative-num-steps 3 --y"
    assert spy.contender(cmd) == "standalone k3"


def test_spy_summary_reads_gzip_and_excludes_stacks(spy, tmp_path: Path):
    import gzip

    path = tmp_path / "spy-9.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(RAW)
    (tmp_path / "spy-9.cmd").write_text("python -m sglang.launch_server --model-path m")
    text = spy.report(path, exclude=("synchronize",))
    assert text.startswith("### spy-9.txt.gz: no-spec, 40 event-loop samples")


def timeline_record(fn: str, t: float, ms: float, mode: str = "decode") -> dict:
    return {"fn": fn, "t": t, "ms": ms, "mode": mode, "bs": 2, "tokens": 2}


@pytest.fixture(scope="module")
def timeline():
    return load_script("sched_timeline")


def test_timeline_iterations_sum_the_calls_inside_them(timeline):
    records = [
        timeline_record("get_next_batch_to_run", 0.000, 0.1, "idle"),
        timeline_record("get_next_batch_to_run", 1.000, 0.5, "prefill"),  # origin
        timeline_record("run_batch", 1.001, 2.0, "prefill"),
        timeline_record("process_batch_result", 1.004, 5.0),
        timeline_record("get_next_batch_to_run", 1.010, 0.4, "prefill"),
        timeline_record("run_batch", 1.011, 3.0, "prefill"),
        timeline_record("get_next_batch_to_run", 1.030, 0.2, "decode"),
        timeline_record("run_batch", 1.031, 4.0),
        timeline_record("resolve_seq_lens_cpu", 1.0311, 1.5),
        timeline_record("target_forward", 1.0327, 2.0),
        timeline_record("process_batch_result", 1.036, 1.0, "prefill"),
        timeline_record("get_next_batch_to_run", 1.040, 0.1, "idle"),  # closes the decode iteration
    ]
    stats = timeline.iteration_stats(records)
    assert set(stats) == {"prefill", "decode"}
    assert [it["iteration"] for it in stats["prefill"]] == pytest.approx([10.0, 20.0])
    assert [it["run_batch"] for it in stats["prefill"]] == pytest.approx([2.0, 3.0])
    assert [it["process_batch_result"] for it in stats["prefill"]] == pytest.approx([5.0, 0.0])
    assert [it["other"] for it in stats["prefill"]] == pytest.approx([2.5, 16.6])
    assert stats["decode"][0]["resolve_seq_lens_cpu"] == pytest.approx(1.5)
    assert stats["decode"][0]["target_forward"] == pytest.approx(2.0)
    # A window from 25 ms after the first busy iteration keeps the decode iteration alone.
    assert set(timeline.iteration_stats(records, start=0.025)) == {"decode"}

    rows = timeline.table([timeline.Timeline("faser k7 (1)", records)]).splitlines()
    assert rows[0].startswith("| server | iteration | count | mean ms | pick |")
    assert rows[0].endswith("| launch | (resolve wait) | (target forward) | result | other |")
    # 10.0 ms decode iteration: pick 0.2, launch 4.0 (resolve 1.5 and the target's forward
    # 2.0 inside), result 1.0, other 4.8
    assert rows[2] == "| faser k7 (1) | decode | 1 | 10.00 | 0.20 | 4.00 | 1.50 | 2.00 | 1.00 | 4.80 |"
    assert rows[3] == "| faser k7 (1) | prefill | 2 | 15.00 | 0.45 | 2.50 | 0.00 | 0.00 | 2.50 | 9.55 |"
    medians = timeline.table([timeline.Timeline("faser k7 (1)", records)], stat="median").splitlines()
    assert medians[0].startswith("| server | iteration | count | median ms |")
    assert medians[3] == "| faser k7 (1) | prefill | 2 | 15.00 | 0.45 | 2.50 | 0.00 | 0.00 | 2.50 | 9.55 |"


def test_timeline_rows_by_batch_size_and_iteration_time(timeline):
    def decode(t, bs):
        return {"fn": "get_next_batch_to_run", "t": t, "ms": 0.1, "mode": "decode", "bs": bs, "tokens": bs}

    # Iterations: bs 2 for 9 ms, bs 2 for 18 ms, bs 40 for 12 ms (the last pick closes it).
    records = [decode(1.000, 2), decode(1.009, 2), decode(1.027, 40), decode(1.039, 40)]
    rows = timeline.table([timeline.Timeline("faser k7 (1)", records)], stat="median", edges=[8, 32]).splitlines()
    assert rows[0].startswith("| server | iteration | batch | count | median ms |")
    assert [r.split(" | ")[2:5] for r in rows[2:]] == [["1-8", "2", "13.50"], [">=33", "1", "12.00"]]
    split = timeline.table([timeline.Timeline("f", records)], edges=[8], above=11.5).splitlines()
    assert [r.split(" | ")[2:5] for r in split[2:]] == [
        ["1-8, <=11.5 ms", "1", "9.00"], ["1-8, >11.5 ms", "1", "18.00"], [">=9, >11.5 ms", "1", "12.00"]
    ]  # fmt: skip


def test_timeline_server_names(timeline):
    assert timeline.server_name({"pid": 5, "speculative_algorithm": None}) == "no-spec (5)"
    named = {"pid": 6, "speculative_algorithm": "STANDALONE", "speculative_num_steps": 3}
    assert timeline.server_name(named) == "standalone k3 (6)"
    configured = {"pid": 7, "speculative_algorithm": "FASER", "speculative_num_steps": 7,
                  "faser_config": "/r/faser-ad@draft_prefill=eager.json"}  # fmt: skip
    assert timeline.server_name(configured) == "faser k7 (7, faser-ad@draft_prefill=eager)"
    assert timeline.server_name({**configured, "host_prefill_plan": True}) == (
        "faser k7 (7, faser-ad@draft_prefill=eager, host plan)"
    )
    assert timeline.server_name({"pid": 8, "host_prefill_plan": True}) == "no-spec (8, host plan)"
    graphed = {"pid": 9, "host_prefill_plan": False, "prefill_graphs": "breakable"}
    assert timeline.server_name(graphed) == "no-spec (9, breakable prefill graphs)"
    assert timeline.server_name({**graphed, "prefill_graphs": "disabled"}) == "no-spec (9)"


def test_timeline_alloc_retries_takes_each_servers_last_count(timeline):
    idle = [timeline_record("get_next_batch_to_run", t, 0.1, "idle") for t in (1.0, 2.0)]
    idle[0]["alloc_retries"], idle[1]["alloc_retries"] = 0, 3
    servers = [timeline.Timeline("faser k7 (1)", idle), timeline.Timeline("no-spec (2)", [])]
    assert timeline.alloc_retries(servers) == "- faser k7 (1): 3 CUDA allocator retries by its last idle iteration"
    idle[0]["device_allocs"], idle[1]["device_allocs"] = 40, 46
    assert timeline.alloc_retries(servers[:1]) == (
        "- faser k7 (1): 3 CUDA allocator retries by its last idle iteration, 6 device allocations after its first"
    )


def test_timeline_load_skips_a_line_cut_off_by_the_server_stopping(timeline, tmp_path: Path):
    path = tmp_path / "sched-3.jsonl"
    header = '{"header": true, "pid": 3, "speculative_algorithm": null}\n'
    path.write_text(header + '{"fn": "run_batch", "t": 1.0, "ms": 2.0, "mode": "decode", "bs": 1, "tokens": 1}\n{"fn": "get_ne')
    loaded = timeline.load(path)
    assert loaded.name == "no-spec (3)" and len(loaded.records) == 1
    packed = tmp_path / "sched-3.jsonl.gz"  # a results directory keeps them gzipped
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert timeline.load(packed).records == loaded.records
    assert timeline.files([tmp_path]) == [path, packed]
