"""The log readers behind the scheduler diagnosis: prefill intervals from server logs,
and the event-loop profile from py-spy raw stacks."""

from __future__ import annotations

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
