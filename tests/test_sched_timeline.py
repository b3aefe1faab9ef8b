"""The scheduler-timeline hooks (faser_sglang.sched_timeline) on stand-in objects; the
end-to-end test on real CPU servers is in test_e2e_faser.py."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from faser_sglang import sched_timeline


class Mode:
    def __init__(self, name: str):
        self.name = name

    def is_extend(self) -> bool:
        return self.name in ("EXTEND", "TARGET_VERIFY")  # as SGLang's

    def is_target_verify(self) -> bool:
        return self.name == "TARGET_VERIFY"

    def is_decode(self) -> bool:
        return self.name == "DECODE"


def batch(mode: str, bs: int, extend_tokens: int | None = None):
    return SimpleNamespace(forward_mode=Mode(mode), reqs=[object()] * bs, extend_num_tokens=extend_tokens)


def read_lines(directory) -> list[dict]:
    """This process's timeline file: its header, then one record per call."""
    (path,) = directory.glob("sched-*.jsonl")
    assert path.name == f"sched-{os.getpid()}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def calls_of(records: list[dict]) -> list[tuple]:
    return [(r["fn"], r["mode"], r["bs"], r["tokens"]) for r in records]


@pytest.fixture(scope="module")
def script():
    """scripts/sched_timeline.py, the reader of the files."""
    from conftest import load_script

    return load_script("sched_timeline")


@pytest.fixture
def timeline_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(sched_timeline.TIMELINE_ENV, str(tmp_path / "t"))
    monkeypatch.setattr(sched_timeline, "_file", None)
    monkeypatch.setattr(sched_timeline, "_idle", False)
    from triton import knobs

    # Opening the file sets Triton's process-wide compile hooks: put back what was there.
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", knobs.runtime.jit_cache_hook)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", knobs.runtime.jit_post_compile_hook)
    yield tmp_path / "t"
    if sched_timeline._file is not None:
        sched_timeline._file.close()


def test_hooks_write_a_header_then_one_line_per_call(timeline_dir):
    scheduler = SimpleNamespace(
        server_args=SimpleNamespace(
            model_path="m", speculative_algorithm="FASER", speculative_num_steps=7, disable_overlap_schedule=False,
            cuda_graph_config=SimpleNamespace(prefill=SimpleNamespace(backend="breakable")),
        )
    )
    hooks = dict(sched_timeline.hooks())
    pick = hooks[f"{sched_timeline.SCHEDULER}.get_next_batch_to_run"]
    launch = hooks[f"{sched_timeline.SCHEDULER}.run_batch"]
    resolve = hooks[f"{sched_timeline.FUTURE_MAP}.resolve_seq_lens_cpu"]

    future_map = object()
    resolve(lambda fm, b: None, future_map, batch("DECODE", 3))  # before the scheduler's first call: not recorded
    prefill = batch("EXTEND", 2, extend_tokens=40)
    plan = pick(lambda s, **kw: SimpleNamespace(batch_to_run=prefill), scheduler, running_batch=None)
    assert plan.batch_to_run is prefill  # the hook returns the original's result
    launch(lambda s, b: "result", scheduler, prefill)
    resolve(lambda fm, b: None, future_map, batch("DECODE", 3))
    for _ in range(3):  # an idle server's loop: the first idle pick closes the iteration
        pick(lambda s: SimpleNamespace(batch_to_run=None), scheduler)
    launch(lambda s, b: None, scheduler, batch("IDLE", 0))
    pick(lambda s: SimpleNamespace(batch_to_run=prefill), scheduler)
    pick(lambda s: SimpleNamespace(batch_to_run=None), scheduler)

    lines = read_lines(timeline_dir)
    assert lines[0] == {
        "header": True,
        "pid": os.getpid(),
        "model_path": "m",
        "speculative_algorithm": "FASER",
        "speculative_num_steps": 7,
        "overlap": True,
        "faser_config": None,
        "host_prefill_plan": False,
        "prefill_graphs": "breakable",
        "triton_compiles": True,
    }
    assert calls_of(lines[1:]) == [
        ("get_next_batch_to_run", "prefill", 2, 40),
        ("run_batch", "prefill", 2, 40),
        ("resolve_seq_lens_cpu", "decode", 3, 3),
        ("get_next_batch_to_run", "idle", 0, 0),
        ("run_batch", "idle", 0, None),
        ("get_next_batch_to_run", "prefill", 2, 40),
        ("get_next_batch_to_run", "idle", 0, 0),
    ]
    assert all(r["ms"] >= 0 and r["t"] > 0 for r in lines[1:])
    # Idle picks carry the allocator's counts (None: CUDA never started here).
    assert [("alloc_retries" in r) for r in lines[1:]] == [False, False, False, True, False, False, True]
    assert lines[4]["alloc_retries"] is None and lines[4]["device_allocs"] is None


def _scheduler() -> SimpleNamespace:
    return SimpleNamespace(
        server_args=SimpleNamespace(
            model_path="m", speculative_algorithm=None, speculative_num_steps=None, disable_overlap_schedule=False,
        )
    )


def _compile(name: str, key: str) -> tuple[object, object]:
    """Triton's two hook calls around one compile, as ``JITFunction._do_compile`` makes
    them; returns each hook's result."""
    from triton import knobs

    kwargs = {
        "key": key,
        "repr": f"{name}[num_warps=4](x: *i64:16, n: i32)",
        "fn": SimpleNamespace(module="m", name=name),
        "compile": {"key": key},
        "is_manual_warmup": False,
        "already_compiled": False,
    }
    return knobs.runtime.jit_cache_hook(**kwargs), knobs.runtime.jit_post_compile_hook(**kwargs)


def test_triton_compiles_are_recorded_once_the_timeline_is_open(timeline_dir, monkeypatch):
    """Each compile while serving is a line with its kernel, specialization and time;
    hooks set before stay called and their results pass through (a truthy cache hook
    result has Triton skip the compile); setting the hooks twice records once."""
    from triton import knobs

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(("cache", kw["key"])) or True)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(("post", kw["key"])))
    pick = dict(sched_timeline.hooks())[f"{sched_timeline.SCHEDULER}.get_next_batch_to_run"]
    pick(lambda s: SimpleNamespace(batch_to_run=None), _scheduler())  # opens the file, sets the hooks
    assert sched_timeline.watch_triton_compiles()  # already set: not wrapped again
    assert _compile("_fwd_kernel", "k1") == (True, None)
    assert seen == [("cache", "k1"), ("post", "k1")]

    lines = read_lines(timeline_dir)
    assert lines[0]["triton_compiles"] is True
    (compiled,) = [r for r in lines[1:] if r["fn"] == "triton_compile"]
    assert compiled["key"] == "k1"
    assert compiled["kernel"] == "_fwd_kernel" and compiled["module"] == "m" and compiled["spec"] == "_fwd_kernel[num_warps=4](x: *i64:16, n: i32)"
    assert compiled["ms"] >= 0 and compiled["t"] > 0


def test_no_triton_compile_lines_before_the_timeline_opens(timeline_dir):
    assert sched_timeline.watch_triton_compiles()
    _compile("_fwd_kernel", "k0")  # before the scheduler's first pick: no file yet
    assert not timeline_dir.exists()


def test_compiles_lists_each_servers_triton_compiles_by_kernel(script):
    def pick(t):
        return {"fn": "get_next_batch_to_run", "t": t, "ms": 0.3, "mode": "decode", "bs": 4, "tokens": 4}

    def compiled(t, kernel, ms, module="sglang.kernels.ops.attention.extend_attention"):
        return {"fn": "triton_compile", "t": t, "ms": ms, "kernel": kernel, "module": module, "spec": f"{kernel}(...)"}

    faser = script.Timeline("faser k7 (1)", [
        pick(10.0), compiled(10.1, "_fwd_kernel", 150.0), pick(10.3), compiled(12.0, "_fwd_kernel", 20.0),
        compiled(12.5, "generate_draft_decode_kv_indices", 120.0, module=None), pick(13.0),
    ])  # fmt: skip
    quiet = script.Timeline("no-spec (2)", [pick(10.0), pick(10.1)])
    assert script.compiles([faser, quiet]) == (
        "- faser k7 (1): 3 Triton compiles, 290 ms in all: extend_attention._fwd_kernel (2, 170 ms), "
        "generate_draft_decode_kv_indices (1, 120 ms); first: (0.10 s, extend_attention._fwd_kernel, 150 ms), "
        "(2.00 s, extend_attention._fwd_kernel, 20 ms), (2.50 s, generate_draft_decode_kv_indices, 120 ms)"
    )
    assert script.compiles([faser], start=2.2).startswith("- faser k7 (1): 1 Triton compiles")
    # The iteration table counts a compile inside the call it waited in, not as a call of its own.
    assert script.iteration_stats(faser.records)["decode"][0]["iteration"] == pytest.approx(300.0)


def test_no_hooks_without_the_environment_variable(monkeypatch):
    monkeypatch.delenv(sched_timeline.TIMELINE_ENV, raising=False)
    assert sched_timeline.timeline_dir() is None


def test_pick_stalls_lists_slow_batch_picks_per_server(script):
    def pick(t, mode, bs, ms):
        return {"fn": "get_next_batch_to_run", "t": t, "ms": ms, "mode": mode, "bs": bs, "tokens": bs}

    stalled = script.Timeline("faser k7 (1)", [
        pick(9.0, "idle", 0, 0.1), pick(10.0, "prefill", 1, 1.5), pick(10.1, "decode", 21, 107.5),
        pick(10.3, "decode", 24, 0.4), pick(12.0, "decode", 40, 111.6),
    ])  # fmt: skip
    steady = script.Timeline("no-spec (2)", [pick(10.0, "prefill", 1, 1.2), pick(10.1, "decode", 21, 0.3)])
    text = script.pick_stalls([stalled, steady], 50.0)
    assert text == (
        "- faser k7 (1): 2 picks over 50 ms, 219 ms in all: (0.10 s, decode, 21, 108 ms), (2.00 s, decode, 40, 112 ms)"
    )
    assert "decode, 40" not in script.pick_stalls([stalled], 50.0, end=1.0)


def test_prefill_fits_split_a_fixed_cost_from_a_cost_per_token(script):
    def call(fn, t, mode, tokens, ms):
        return {"fn": fn, "t": t, "ms": ms, "mode": mode, "bs": 1, "tokens": tokens}

    records = [call("get_next_batch_to_run", 5.0, "prefill", 1, 1.0)]
    for i, tokens in enumerate((1, 1, 101, 201)):  # launch 10 + tokens / 100 ms; its forward 2 ms less
        records += [call("run_batch", 10.0 + i, "prefill", tokens, 10 + tokens / 100),
                    call("target_forward", 10.0 + i, "prefill", tokens, 8 + tokens / 100)]  # fmt: skip
    records.append(call("run_batch", 20.0, "decode", 8, 99.0))  # not a prefill
    server = script.Timeline("faser k7 (1)", records)
    assert script.prefill_fits([server]) == (
        "- faser k7 (1): prefill launch 10.0 ms + 0.0100 ms a token (4), target forward 8.0 ms + 0.0100 ms a token (4)"
    )
    assert script.prefill_fits([server], end=7.0) == ""  # fewer than two prompt lengths in the window
    assert script.prefill_fits([script.Timeline("idle (2)", [])]) == ""


def test_prefill_after_groups_prefills_by_the_iteration_before(script):
    def call(fn, t, mode, ms=1.0, tokens=40):
        return {"fn": fn, "t": t, "ms": ms, "mode": mode, "bs": 1, "tokens": tokens}

    records = []
    for t, before, forward_ms in ((1.0, "idle", 20.0), (2.0, "decode", 30.0), (3.0, "decode", 34.0),
                                  (4.0, "prefill", 25.0)):  # fmt: skip
        records += [call("get_next_batch_to_run", t, before), call("get_next_batch_to_run", t + 0.1, "prefill"),
                    call("target_forward", t + 0.2, "prefill", forward_ms)]  # fmt: skip
        if before == "decode":  # a plain decode: its target forward runs inside it
            records.insert(-2, call("target_forward", t + 0.05, "decode"))
    records += [call("get_next_batch_to_run", 5.0, "idle"), call("get_next_batch_to_run", 5.01, "prefill"),
                call("target_forward", 5.02, "prefill", 28.0)]  # a 10 ms idle: the last step may still run  # fmt: skip
    # A drafting decode (no target forward of its own), then a prefill of one token after it.
    records += [call("get_next_batch_to_run", 6.0, "decode"), call("run_batch", 6.01, "decode"),
                call("get_next_batch_to_run", 6.1, "prefill"), call("target_forward", 6.2, "prefill", 50.0, tokens=1)]
    server = script.Timeline("faser k4 (1)", records)
    assert script.prefill_after([server]) == (
        "- faser k4 (1): prefill target forward, median after decode 32.0 ms (2), after idle 20.0 ms (1), "
        "after prefill 25.0 ms (1), after short idle 28.0 ms (1)\n"
        "- faser k4 (1): one-token prefill target forward, median after drafting decode 50.0 ms (1)"
    )
    # files recorded before target forwards were: the prefill's launch instead
    launches = [dict(r, fn="run_batch") if r["fn"] == "target_forward" else r for r in records]
    assert script.prefill_after([script.Timeline("no-spec (1)", launches)]).startswith("- no-spec (1): prefill launch,")
    assert script.prefill_after([script.Timeline("idle (2)", [])]) == ""


def test_target_forward_records_a_batch_or_a_forward_batch(timeline_dir):
    scheduler = SimpleNamespace(
        server_args=SimpleNamespace(
            model_path="m", speculative_algorithm=None, speculative_num_steps=None, disable_overlap_schedule=False
        )
    )
    hooks = dict(sched_timeline.hooks())
    pick = hooks[f"{sched_timeline.SCHEDULER}.get_next_batch_to_run"]
    forward = hooks[f"{sched_timeline.TP_WORKER}.forward_batch_generation"]
    worker = object()

    def original(w, batch=None, forward_batch=None):
        return "out"

    forward(original, worker, batch("EXTEND", 1, extend_tokens=9))  # before the scheduler's first call
    prefill = batch("EXTEND", 2, extend_tokens=40)
    pick(lambda s: SimpleNamespace(batch_to_run=prefill), scheduler)
    assert forward(original, worker, prefill) == "out"
    # FASER's plain decode passes SGLang's ForwardBatch: rows and input ids, no requests;
    # SGLang's verifies do too, some of them by position.
    plain = SimpleNamespace(forward_mode=Mode("DECODE"), batch_size=3, input_ids=SimpleNamespace(shape=(3,)))
    forward(original, worker, None, forward_batch=plain)
    verify = SimpleNamespace(forward_mode=Mode("TARGET_VERIFY"), batch_size=3, input_ids=SimpleNamespace(shape=(12,)))
    forward(original, worker, None, verify)
    forward(original, worker, batch("TARGET_VERIFY", 2, extend_tokens=5))  # NGRAM's verify: a batch

    assert calls_of(read_lines(timeline_dir)[1:]) == [
        ("get_next_batch_to_run", "prefill", 2, 40),
        ("target_forward", "prefill", 2, 40),
        ("target_forward", "decode", 3, 3),
        ("target_forward", "verify", 3, 12),
        ("target_forward", "verify", 2, None),
    ]
