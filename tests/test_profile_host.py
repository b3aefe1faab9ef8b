"""The host-cost profiler script: decode-rate parsing, profile summary, report, with a fake server."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from faser_sglang.bench import servers

REPO = Path(__file__).resolve().parents[1]

FASER_LINE = (
    "[2026-12-01 00:00:57] Decode batch, #running-req: {n}, #token: 2454, token usage: 0.01, accept len: 1.40, "
    "accept rate: 0.10, cuda graph: False, gen throughput (token/s): {rate}, #queue-req: 0\n"
)
PLAIN_LINE = (
    "[2026-11-30 23:59:01] Decode batch, #running-req: {n}, #token: 44051, token usage: 0.15, cuda graph: True, "
    "gen throughput (token/s): {rate}, #queue-req: 0\n"
)


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("profile_host", REPO / "scripts" / "profile_host.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_decode_rate_is_the_median_of_the_lines_at_that_batch(script):
    log = FASER_LINE.format(n=32, rate=161.05)  # first line after idle: covers the idle time
    log += "".join(FASER_LINE.format(n=32, rate=r) for r in (9703.38, 9600.0, 9800.0))
    log += PLAIN_LINE.format(n=31, rate=50.0) + "[2026-12-01] Prefill batch, #new-seq: 4\n"
    assert script.decode_rate(log, 32) == pytest.approx(9651.69)
    assert script.decode_rate(PLAIN_LINE.format(n=128, rate=61413.57), 128) == pytest.approx(61413.57)
    assert script.decode_rate(log, 64) is None


def test_pyspy_summary_ranks_the_scheduler_loop_only(script, tmp_path):
    loop = "run_scheduler_process (/x/site-packages/sglang/srt/managers/scheduler.py:4947);Scheduler.event_loop_normal (/x/site-packages/sglang/srt/managers/scheduler.py:1)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{loop};FaserWorker._decode (/r/faser_sglang/spec_worker/worker.py:120);kv_slots (/r/faser_sglang/spec_worker/batch_views.py:9) 30\n"
        f"{loop};Scheduler.process_batch_result (/x/site-packages/sglang/srt/managers/scheduler.py:77) 10\n"
        f"{loop};Scheduler.on_idle (/x/site-packages/sglang/srt/managers/scheduler.py:90) 25\n"
        "Thread.run (threading.py:1);WatchdogRaw._watchdog_thread (/x/site-packages/sglang/srt/utils/watchdog.py:3) 500\n"
    )
    md = script.summarize_pyspy(raw)
    assert md.startswith("40 samples of the busy scheduler loop")  # idle samples left out
    inclusive, own = md.split("| self |")
    assert "watchdog" not in md.lower() and "on_idle" not in md
    assert "event_loop_normal" not in inclusive  # on every sampled stack: says nothing
    assert "| 75.0% | `FaserWorker._decode (faser_sglang/spec_worker/worker.py)` |" in inclusive
    assert "| 75.0% | `kv_slots (faser_sglang/spec_worker/batch_views.py)` |" in own
    assert "| 25.0% | `Scheduler.process_batch_result (sglang/srt/managers/scheduler.py)` |" in own


def test_run_reports_each_contender_against_no_spec(script, tmp_path, monkeypatch):
    rates = {"no-spec": 20000.0, "faser-k0": 16000.0}
    launched = []

    class FakeServer:
        base_url = "http://fake"

        def __init__(self, name: str):
            self.name = name
            self.log_path = tmp_path / f"{name}.log"
            self.log_path.write_text("")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    def fake_launch(model_path, args, env=None, timeout=0.0, log_dir=None):
        name = "faser-k0" if "FASER" in args else "no-spec"
        launched.append((name, list(args), dict(env or {})))
        return FakeServer(name)

    def fake_replay(base_url, reqs, arrivals, sampling):
        server = fake_launch.current
        n = len(reqs)
        with server.log_path.open("a") as f:
            f.write(PLAIN_LINE.format(n=n, rate=rates[server.name] * n / 32))
        return type("R", (), {"timings": []})()

    def launch_and_remember(*a, **k):
        fake_launch.current = fake_launch(*a, **k)
        return fake_launch.current

    monkeypatch.setattr(script.servers, "launch", launch_and_remember)
    monkeypatch.setattr(script, "replay", fake_replay)
    monkeypatch.setattr(script.shutil, "which", lambda _: None)  # no py-spy here
    out = tmp_path / "out"
    script.main(["--target", "T", "--draft", "D", "--out", str(out), "--contenders", "no-spec", "faser-k0",
                 "--concurrency", "32", "64", "--server-args", "--device cpu"])  # fmt: skip
    report = json.loads((out / "host.json").read_text())
    assert report["ms_per_token"]["no-spec"]["32"] == pytest.approx(1000 * 32 / 20000)
    assert report["ms_per_token"]["faser-k0"]["64"] == pytest.approx(1000 * 64 / 32000)
    assert "| faser-k0 | 2.00 (1.25x) | 2.00 (1.25x) |" in (out / "host.md").read_text()
    faser_args, faser_env = launched[1][1], launched[1][2]
    assert faser_args[:2] == ["--device", "cpu"] and "--speculative-algorithm" in faser_args
    assert json.loads(Path(faser_env["FASER_CONFIG"]).read_text()) == {
        "policy": "ema", "min_token_value": 0.999, "sampled_chain": False,  # its requests are greedy
    }  # fmt: skip


def test_fixed_length_faser_contender_drafts_k_every_step(tmp_path):
    c = servers.steady_contender("faser-k3", "D", 7, tmp_path)
    assert c.args[c.args.index("--speculative-num-steps") + 1] == "3"
    assert json.loads(Path(c.env["FASER_CONFIG"]).read_text()) == {"policy": "fixed"}
    assert servers.steady_contender("no-spec-sync", "D", 7, tmp_path).args == ("--disable-overlap-schedule",)
    k0 = servers.steady_contender("faser-k0", "D", 7, tmp_path)
    k0_sync = servers.steady_contender("faser-k0-sync", "D", 7, tmp_path)
    assert k0_sync.args == (*k0.args, "--disable-overlap-schedule") and k0_sync.env == k0.env
    variant = servers.steady_contender("faser-k2@draft_chain=false", "D", 7, tmp_path)
    assert variant.name == "faser-k2@draft_chain=false"
    assert variant.args[variant.args.index("--speculative-num-steps") + 1] == "2"
    assert json.loads(Path(variant.env["FASER_CONFIG"]).read_text()) == {"policy": "fixed", "draft_chain": False}
    with pytest.raises(ValueError, match="draft_chain"):
        servers.steady_contender("faser-k2@draft_chain=maybe", "D", 7, tmp_path)


def test_greedy_steady_contenders_skip_the_sampled_chains(tmp_path):
    """A greedy profile's FASER servers capture no sampled chain graphs (no step replays
    them); a variant may still turn them on."""
    def config(name: str) -> dict:
        c = servers.steady_contender(name, "D", 7, tmp_path, greedy=True)
        return json.loads(Path(c.env["FASER_CONFIG"]).read_text())

    assert config("faser-k3") == {"policy": "fixed", "sampled_chain": False}
    assert config("faser-k0")["sampled_chain"] is False
    assert config("faser-k3+speculative-draft-attention-backend=triton")["sampled_chain"] is False
    assert config("faser-k3@sampled_chain=true") == {"policy": "fixed", "sampled_chain": True}
