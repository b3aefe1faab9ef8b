"""Adaptive drafter (CPU, no server): acceptance windows, cost model, allocator, policy,
and the profiling script driven with a fake server."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import random
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import H200_7B, H200_14B
from faser_sglang.bench.client import ReplayResult, RequestTiming
from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.adaptive import (
    AcceptanceWindows,
    AdaptiveDrafterPolicy,
    CatchupPieces,
    CostKey,
    CostModel,
    Deployment,
    DraftCost,
    DraftingOverhead,
    ModelShape,
    PlainCost,
    StepSample,
    VerifyCost,
    allocate,
    analytical,
    charged_catchup,
    deployment_from_runners,
    fit,
    gpu_spec,
    read_cost_entries,
    write_cost_entry,
)
from faser_sglang.spec_worker.adaptive import allocator, drafter
from faser_sglang.spec_worker.policy import (
    EmaLengthPolicy,
    FixedLengthPolicy,
    RandomLengthPolicy,
    StepContext,
    draft_caps,
    make_policy,
)

REPO = Path(__file__).resolve().parents[1]

# Llama-3.1-8B target, Llama-3.2-1B-like draft (config.json fields).
TARGET_CONFIG = dict(
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    intermediate_size=14336, vocab_size=128256,
)  # fmt: skip
DRAFT_CONFIG = dict(
    hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    intermediate_size=8192, vocab_size=128256,
)  # fmt: skip

# A profiled-looking model: 12 ms weight-bound verify that turns compute bound past
# 512 tokens, 1.5 ms draft forwards.
KNOWN = CostModel(
    draft=DraftCost(
        extend_forward=2.0e-3, decode_forward=1.5e-3, row_step=1.0e-5, catchup_token=4.0e-6,
        context_row_step=2.0e-9,
    ),
    verify=VerifyCost(
        fixed=12e-3, row=2.0e-5, token=5.0e-6, context_token=2.0e-8, knots=(512.0,),
        knot_slopes=(4.0e-5,),
    ),
    source="profiled",
)  # fmt: skip


def cost(verify_fixed=10e-3, verify_token=0.0, knot=1e9, slope=0.0, forward=1e-3, row=0.0) -> CostModel:
    """A synthetic cost model with the knobs the allocator tests turn."""
    return CostModel(
        DraftCost(forward, forward, row, 0.0, 0.0),
        VerifyCost(verify_fixed, 0.0, verify_token, 0.0, (knot,), (slope,)),
        "synthetic",
    )


def constant_gains(alphas, k_max: int) -> np.ndarray:
    """[bs, k_max] gains of requests whose every position has acceptance alpha_i."""
    return np.cumprod(np.repeat(np.asarray(alphas, float)[:, None], k_max, axis=1), axis=1)


def run_allocate(gains, model, seq_len=500, catchup=1, max_drafts=None):
    bs = gains.shape[0]
    return allocate(gains, np.full(bs, seq_len), np.full(bs, catchup), model, max_drafts=max_drafts)


# --- acceptance windows ----------------------------------------------------------


def windows(window=8, strength=1e-6, base=0.5, pool=1024, pool_strength=None) -> AcceptanceWindows:
    return AcceptanceWindows(
        window=window, positions=8, base_rate=base, prior_strength=strength,
        pool_prior_strength=strength if pool_strength is None else pool_strength, pool_size=pool,
    )  # fmt: skip


def test_prefix_semantics():
    w = windows()
    w.observe(["r"], [4], [2])  # positions 0, 1 accepted, 2 rejected, 3 untested
    alpha = w.alphas(["r"], 4)[0]
    np.testing.assert_allclose(alpha[:3], [1.0, 1.0, 0.0], atol=1e-5)
    assert alpha[3] == pytest.approx(0.5)  # untested anywhere: the base rate
    w.observe(["s"], [3], [3])  # all accepted: no failure observed, position 3 untested
    np.testing.assert_allclose(w.alphas(["s"], 4)[0], [1.0, 1.0, 1.0, 0.5], atol=1e-5)


def test_expected_accepted_is_sum_of_prefix_products():
    w = windows(strength=1.0, base=0.6)
    # No evidence anywhere: every alpha is the base rate.
    assert w.expected_accepted("new", 3) == pytest.approx(0.6 + 0.36 + 0.216)
    assert w.expected_accepted("new", 0) == 0.0
    w.observe(["r"], [2], [1])  # alpha_0 = (1 + 1 * p0) / 2, alpha_1 = (0 + p1) / 2
    p = w.pooled_alphas()
    a0, a1 = (1 + p[0]) / 2, p[1] / 2
    assert w.expected_accepted("r", 2) == pytest.approx(a0 + a0 * a1)


def test_window_evicts_old_steps_and_idle_steps_count():
    w = windows(window=2)
    w.observe(["r"], [4], [0])
    assert w.alphas(["r"], 1)[0, 0] == pytest.approx(0.0, abs=1e-5)
    w.observe(["r"], [4], [4])
    w.observe(["r"], [4], [4])  # the rejection has left the window
    assert w.alphas(["r"], 1)[0, 0] == pytest.approx(1.0, abs=1e-5)
    w.observe(["r"], [0], [0])
    w.observe(["r"], [0], [0])  # two non-drafting steps: no own evidence left
    np.testing.assert_allclose(w.alphas(["r"], 4), w.pooled_alphas()[None, :4])


def test_prior_comes_from_recent_requests_and_survives_forget():
    w = windows(strength=2.0, base=0.7, pool=16)
    for i in range(16):
        w.observe([f"bad{i}"], [4], [0])
        w.forget(f"bad{i}")
    fresh = w.alphas(["new"], 1)[0, 0]
    assert fresh == pytest.approx(2 * 0.7 / 18)  # 16 failures + 2 prior pseudo-counts
    for i in range(16):  # the pool is a window too: good traffic replaces the bad
        w.observe([f"good{i}"], [4], [4])
    assert w.alphas(["new"], 1)[0, 0] > 0.9


def test_pool_and_requests_weigh_their_priors_apart():
    w = windows(strength=2.0, base=0.7, pool_strength=8.0)
    w.observe(["a", "b", "c", "d"], [4] * 4, [0, 1, 0, 0])  # position 0: 1 success in 4 trials
    pooled = (1 + 8 * 0.7) / (4 + 8)
    assert w.pooled_alphas()[0] == pytest.approx(pooled)
    assert w.alphas(["a"], 1)[0, 0] == pytest.approx(2 * pooled / 3)  # own: 0 of 1, weight 2
    assert w.alphas(["new"], 1)[0, 0] == pytest.approx(pooled)


def test_pool_evidence_ages_out_when_nobody_drafts():
    w = windows(strength=2.0, base=0.7, pool=16)
    for i in range(8):
        w.observe([f"bad{i}"], [4], [0])
    assert w.pooled_alphas()[0] == pytest.approx(2 * 0.7 / 10)
    for _ in range(8):  # eight steps of 16 requests without drafts: eight entries, no evidence
        w.observe([f"idle{i}" for i in range(16)], [0] * 16, [0] * 16)
    assert w.pooled_alphas()[0] == pytest.approx(2 * 0.7 / 10)  # the failures are still in the pool
    w.observe(["idle0"], [0], [0])
    assert w.pooled_alphas()[0] == pytest.approx((2 * 0.7) / 9)  # the oldest failure aged out
    for _ in range(7):
        w.observe(["idle0", "idle1"], [0, 0], [0, 0])
    np.testing.assert_allclose(w.pooled_alphas(), 0.7)  # aged out: the base rate again


def test_many_requests_reuse_and_grow_slots():
    w = AcceptanceWindows(
        window=4, positions=8, base_rate=0.5, prior_strength=1e-6, pool_prior_strength=1e-6, initial_capacity=2
    )
    rids = [f"r{i}" for i in range(10)]
    w.observe(rids, [3] * 10, [i % 4 for i in range(10)])
    a = w.alphas(rids, 3)
    for i in range(10):
        acc = i % 4
        np.testing.assert_allclose(a[i, :acc], 1.0, atol=1e-5)
        if acc < 3:
            assert a[i, acc] == pytest.approx(0.0, abs=1e-5)
    for rid in rids:
        w.forget(rid)
    w.observe(["x"], [2], [0])  # a recycled slot starts empty
    assert w.alphas(["x"], 1)[0, 0] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError):
        w.observe(["x"], [2], [3])


# --- cost model -----------------------------------------------------------------


def synthetic_steps(model: CostModel, n: int, seed: int, noise: float, with_draft_seconds: bool):
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        bs = int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256]))
        cap = int(rng.integers(0, 9))
        k = tuple(int(x) for x in rng.integers(0, cap + 1, bs))
        seq = tuple(int(x) for x in rng.integers(50, 8000, bs))
        catchup = tuple(int(x) for x in rng.integers(1, 4, bs))
        draft = model.draft_time(k, seq, catchup) * (1 + noise * rng.standard_normal())
        verify = model.verify_time(k, seq) * (1 + noise * rng.standard_normal())
        if not any(k) and model.plain is not None:  # a plain decode step
            draft, verify = 0.0, model.no_draft_time(seq) * (1 + noise * rng.standard_normal())
        samples.append(StepSample(k, seq, catchup, draft + verify, draft if with_draft_seconds else None))
    return samples


def test_fit_recovers_known_coefficients_and_reports_mape():
    samples = synthetic_steps(KNOWN, 600, seed=0, noise=0.01, with_draft_seconds=True)
    model = fit(samples, knots=(256, 512, 1024))
    assert model.source == "profiled" and model.num_samples == 600
    assert model.holdout_mape < 0.02
    for name in ("extend_forward", "decode_forward", "row_step"):
        assert getattr(model.draft, name) == pytest.approx(getattr(KNOWN.draft, name), rel=0.1)
    assert model.verify.fixed == pytest.approx(KNOWN.verify.fixed, rel=0.05)
    assert model.verify.context_token == pytest.approx(KNOWN.verify.context_token, rel=0.1)
    slopes = dict(zip(model.verify.knots, model.verify.knot_slopes))
    assert slopes[512.0] == pytest.approx(4.0e-5, rel=0.15)  # the compute-bound knee
    assert slopes[256.0] < 4e-6 and slopes[1024.0] < 4e-6


def test_fit_prices_each_catch_up_forward():
    """A catch-up longer than the draft's CUDA graphs runs in pieces; the trace records
    the step's piece size and the fit prices the forwards as the policy does."""
    rng = np.random.default_rng(5)
    samples = []
    for s in synthetic_steps(KNOWN, 400, seed=5, noise=0.0, with_draft_seconds=True):
        catchup = tuple(int(c) for c in rng.integers(1, 120, len(s.draft_lens)))  # up to 8 pieces of 64
        draft = KNOWN.draft_time(s.draft_lens, s.seq_lens, catchup, 64) if any(s.draft_lens) else 0.0
        verify = s.seconds - (s.draft_seconds or 0.0)
        samples.append(replace(s, catchup=catchup, seconds=draft + verify, draft_seconds=draft, piece_tokens=64))
    model = fit(samples, knots=(256, 512, 1024))
    assert model.draft.extend_forward == pytest.approx(KNOWN.draft.extend_forward, rel=0.02)
    assert model.draft.catchup_token == pytest.approx(KNOWN.draft.catchup_token, rel=0.05)
    assert model.holdout_mape < 0.01
    record = {"draft_lens": [2], "seq_lens": [300], "draft_kv_lens": [0], "seconds": 0.02}
    assert StepSample.from_trace_record(record).piece_tokens is None  # traces before pieces
    assert StepSample.from_trace_record({**record, "catchup_piece_tokens": 128}).piece_tokens == 128
    # A 301-token catch-up in pieces of 128 is priced as 3 forwards.
    one, three = (KNOWN.draft_time((2,), (300,), (301,), p) for p in (None, 128))
    assert three - one == pytest.approx(2 * KNOWN.draft.extend_forward)


def test_a_chain_runs_every_drafting_row_to_the_longest_draft():
    """Chained (draft_chain): rows of k = (3, 1, 0) pay 2 + 2 DECODE rows and read their
    contexts 3 + 3 times, against 2 + 0 rows and 3 + 1 reads one forward per step; the
    forwards are the same."""
    k, seq, catchup = (3, 1, 0), (100, 200, 300), (1, 1, 1)
    rows = CostModel(DraftCost(0.0, 0.0, 1.0, 0.0, 0.0), KNOWN.verify, "synthetic")
    reads = CostModel(DraftCost(0.0, 0.0, 0.0, 0.0, 1.0), KNOWN.verify, "synthetic")
    forwards = CostModel(DraftCost(1.0, 10.0, 0.0, 0.0, 0.0), KNOWN.verify, "synthetic")
    assert [rows.draft_time(k, seq, catchup, chained=c) for c in (False, True)] == [2.0, 4.0]
    assert [reads.draft_time(k, seq, catchup, chained=c) for c in (False, True)] == [500.0, 900.0]
    assert [forwards.draft_time(k, seq, catchup, chained=c) for c in (False, True)] == [21.0, 21.0]
    assert KNOWN.step_time(k, seq, catchup, chained=True) > KNOWN.step_time(k, seq, catchup)
    record = {"draft_lens": [3, 1], "seq_lens": [100, 200], "draft_kv_lens": [100, 200], "seconds": 0.02}
    chained = [StepSample.from_trace_record({**record, "draft_steps": v}).chained for v in ("graph", "chain", "loop", "none")]
    assert chained == [True, True, False, False] and not StepSample.from_trace_record(record).chained


def test_a_lagging_drafting_row_lengthens_its_chain_by_a_step():
    """A drafting row whose draft KV lags its committed length (catch-up of 2 or more
    tokens) costs a chain one forward more, with every drafting row in it; a chain of
    one step (m = 1, the catch-up alone) and a loop do not pay it."""
    k, seq = (3, 1, 0), (100, 200, 300)
    model = CostModel(DraftCost(1.0, 10.0, 100.0, 0.0, 0.0), KNOWN.verify, "synthetic")
    steady, lagging, idle_lags = (1, 1, 1), (1, 2, 1), (1, 1, 5)  # the third row does not draft
    assert model.draft_time(k, seq, steady, chained=True) == 1.0 + 2 * 10.0 + 2 * 2 * 100.0
    assert model.draft_time(k, seq, lagging, chained=True) == 1.0 + 3 * 10.0 + 2 * 3 * 100.0
    assert model.draft_time(k, seq, idle_lags, chained=True) == model.draft_time(k, seq, steady, chained=True)
    assert model.draft_time(k, seq, lagging) == model.draft_time(k, seq, steady)  # a loop: no chain
    assert model.draft_time((1, 1, 0), seq, lagging, chained=True) == 1.0 + 0.0  # m = 1: no chain


def test_allocator_prices_the_step_a_lagging_request_adds_to_a_chain():
    """A weak request rides a strong one's chain for its verify tokens alone, unless its
    draft KV lags: then drafting it lengthens the chain by a step, and it is left out."""
    model = cost(verify_fixed=10e-3, verify_token=0.2e-3, forward=1e-3)
    gains, seq = constant_gains([0.9, 0.3], 3), np.full(2, 500)
    assert allocate(gains, seq, np.array([1.0, 1.0]), model, chained=True).draft_lens == (3, 2)
    lagging = allocate(gains, seq, np.array([1.0, 2.0]), model, chained=True)
    assert lagging.draft_lens == (3, 0)
    assert lagging.step_seconds == pytest.approx(model.step_time((3, 0), seq, (1, 2), chained=True))


def test_a_resuming_request_is_charged_its_lag_step_over_its_horizon():
    """A lag of one token (after accepting every draft) recurs and is charged in full;
    a backlog's lag (a request resuming after plain steps) is paid once, so a step is
    charged 1/horizon of it, as of the backlog's tokens."""
    assert drafter.lag_weights(np.array([1.0, 2.0, 9.0]), 16.0).tolist() == [0.0, 1.0, 0.0625]
    assert drafter.lag_weights(np.array([9.0, 9.0]), np.array([4.0, 1.0])).tolist() == [0.25, 1.0]
    model = cost(verify_fixed=10e-3, verify_token=0.2e-3, forward=1e-3, row=0.1e-3)
    gains, seq, catchup = constant_gains([0.9, 0.9], 3), np.full(2, 500), np.array([1.0, 9.0])
    full = allocate(gains, seq, catchup, model, chained=True)
    quarter = allocate(gains, seq, catchup, model, chained=True, lag_weights=np.array([0.0, 0.25]))
    assert full.draft_lens == quarter.draft_lens == (3, 3)
    step = 1e-3 + 2 * 0.1e-3  # the lag's decode forward and a row per drafting request
    assert full.step_seconds - quarter.step_seconds == pytest.approx(0.75 * step)


def test_fit_recovers_coefficients_from_chained_and_looped_steps():
    """A profile of a chain server holds chained steps (greedy) and looped ones (sampled);
    the fit prices each as it ran, and predicts both."""
    rng = np.random.default_rng(9)
    samples = []
    for s in synthetic_steps(KNOWN, 600, seed=9, noise=0.0, with_draft_seconds=True):
        chained = bool(rng.random() < 0.5)
        draft = KNOWN.draft_time(s.draft_lens, s.seq_lens, s.catchup, chained=chained) if any(s.draft_lens) else 0.0
        samples.append(replace(s, seconds=s.seconds - (s.draft_seconds or 0.0) + draft, draft_seconds=draft, chained=chained))
    model = fit(samples, knots=(256, 512, 1024))
    assert model.holdout_mape < 0.01
    for name in ("decode_forward", "row_step", "context_row_step"):
        assert getattr(model.draft, name) == pytest.approx(getattr(KNOWN.draft, name), rel=0.05)


def test_joint_fit_without_draft_seconds_still_predicts():
    samples = synthetic_steps(KNOWN, 600, seed=1, noise=0.01, with_draft_seconds=False)
    model = fit(samples)
    assert model.holdout_mape < 0.03
    fresh = synthetic_steps(KNOWN, 50, seed=2, noise=0.0, with_draft_seconds=False)
    for s in fresh:
        assert model.step_time(s.draft_lens, s.seq_lens, s.catchup) == pytest.approx(s.seconds, rel=0.06)


# A plain decode: the verify's forward at N = bs, 5 ms cheaper (no verify path).
PLAIN_KNOWN = PlainCost(
    fixed=KNOWN.verify.fixed - 5e-3, row=KNOWN.verify.row + KNOWN.verify.token,
    context_token=KNOWN.verify.context_token, knots=KNOWN.verify.knots, knot_slopes=KNOWN.verify.knot_slopes,
)  # fmt: skip


def test_fit_gives_steps_without_drafts_their_own_term():
    """Plain decode steps (nobody drafts) cost less than a zero-length verify; the fit
    prices them apart when the profile has enough of them, and not otherwise."""
    known = replace(KNOWN, plain=PLAIN_KNOWN)
    samples = synthetic_steps(known, 600, seed=4, noise=0.01, with_draft_seconds=True)
    assert 40 < sum(not any(s.draft_lens) for s in samples) < 120  # cap 0: one step in nine
    model = fit(samples, knots=(256, 512, 1024))
    assert model.holdout_mape < 0.02
    assert model.plain.fixed == pytest.approx(PLAIN_KNOWN.fixed, rel=0.05)
    assert model.verify.fixed == pytest.approx(KNOWN.verify.fixed, rel=0.05)  # not dragged down
    assert model.step_time((0, 0), (100, 200), (1, 1)) == pytest.approx(known.plain.time(2, 300.0), rel=0.05)
    assert model.step_time((1, 0), (100, 200), (1, 1)) == pytest.approx(known.step_time((1, 0), (100, 200), (1, 1)), rel=0.05)
    few = [s for s in samples if any(s.draft_lens)] + [s for s in samples if not any(s.draft_lens)][:3]
    assert fit(few).plain is None  # too few to fit the term: priced as verifies
    assert CostModel.from_dict(model.to_dict()) == model
    older = model.to_dict()
    del older["plain"]  # a cost file written before the term existed
    assert CostModel.from_dict(older).plain is None


def test_fit_needs_enough_steps():
    with pytest.raises(ValueError, match="at least 20"):
        fit(synthetic_steps(KNOWN, 5, seed=0, noise=0.0, with_draft_seconds=True))


def test_trace_record_to_sample():
    record = {"step": 3, "rids": ["a", "b"], "draft_lens": [2, 0], "num_accepted": [1, 0],
              "seconds": 0.02, "seq_lens": [10, 7], "draft_kv_lens": [9, 7], "draft_seconds": 0.005}  # fmt: skip
    s = StepSample.from_trace_record(record)
    assert s.catchup == (2, 1) and s.draft_seconds == 0.005 and s.seq_lens == (10, 7)
    with pytest.raises(ValueError, match="seq_lens"):
        StepSample.from_trace_record({"draft_lens": [1], "seconds": 0.01})


def test_cost_file_round_trip_and_key_matching(tmp_path):
    path = tmp_path / "costs.json"
    h200 = CostKey.of("NVIDIA H200", "meta-llama/Llama-3.1-8B", "/models/Llama-3.2-1B/", "flashinfer", "torch.bfloat16")
    h100 = CostKey.of("NVIDIA H100 80GB HBM3", "Llama-3.1-8B", "Llama-3.2-1B", "flashinfer", "bfloat16")
    model = fit(synthetic_steps(KNOWN, 100, seed=3, noise=0.01, with_draft_seconds=True))
    write_cost_entry(path, h200, model)
    write_cost_entry(path, h100, KNOWN)
    entries, _ = read_cost_entries(path)
    assert entries[h200] == model and entries[h100] == KNOWN
    # The same deployment spelled from a local copy and a torch dtype matches.
    assert CostKey.of("NVIDIA H200", "/data/Llama-3.1-8B", "Llama-3.2-1B", "flashinfer", "bfloat16") == h200
    assert CostKey.of("NVIDIA H200", "Llama-3.1-8B", "Llama-3.2-1B", "triton", "bfloat16") not in entries
    write_cost_entry(path, h200, KNOWN)  # replacing keeps the other entry
    assert read_cost_entries(path) == ({h200: KNOWN, h100: KNOWN}, 3)
    assert json.loads(path.read_text())["entries"][0]["model"]["source"] == "profiled"
    # A file fitted before catch-ups ran in pieces (format 1) still loads; a new entry
    # does not keep its other entries (they would be stamped with the new format).
    older = json.loads(path.read_text())
    path.write_text(json.dumps({**older, "format": 1}))
    assert read_cost_entries(path) == ({h200: KNOWN, h100: KNOWN}, 1)
    write_cost_entry(path, h200, model)
    assert read_cost_entries(path) == ({h200: model}, 3)
    path.write_text(json.dumps({**older, "format": 7}))
    with pytest.raises(ValueError, match="format 7"):
        read_cost_entries(path)
    # A negative price (a hand-edited file) would let the allocator's bound rule out
    # drafts that pay: refused, naming the term.
    older["entries"][0]["model"]["draft"]["catchup_token"] = -1e-3
    path.write_text(json.dumps(older))
    with pytest.raises(ValueError, match="draft.catchup_token .* is negative"):
        read_cost_entries(path)


def test_plain_term_extrapolates_past_a_profile_whose_contexts_grow_with_the_batch():
    """In a profile the plain steps' contexts grow with the batch (here 400 tokens a
    request, 1-64 requests), so their per-request and per-context prices cannot be told
    apart. The fit takes them from the verify (the same forward at N = bs), so a plain
    step of 128 requests of 1000 tokens is priced right, and stays below the verify of
    the same batch; so is one of 600 requests, past the verify's knot at 512 tokens."""
    known = replace(KNOWN, plain=PLAIN_KNOWN)
    rng = np.random.default_rng(9)
    samples = [s for s in synthetic_steps(known, 400, seed=9, noise=0.0, with_draft_seconds=True) if any(s.draft_lens)]
    for _ in range(40):  # plain steps, context 400 per request
        bs = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
        seq = tuple(int(x) for x in rng.integers(350, 450, bs))
        seconds = known.no_draft_time(seq) * (1 + 0.01 * rng.standard_normal())
        samples.append(StepSample((0,) * bs, seq, (1,) * bs, seconds))
    model = fit(samples, knots=(256, 512, 1024))
    seq = (1000,) * 128
    assert model.no_draft_time(seq) == pytest.approx(known.no_draft_time(seq), rel=0.03)
    assert model.no_draft_time(seq) < model.verify.time(128, 128, 128_000)
    seq = (1000,) * 600
    assert model.no_draft_time(seq) == pytest.approx(known.no_draft_time(seq), rel=0.03)
    assert model.no_draft_time(seq) < model.verify.time(600, 600, 600_000)
    written = model.to_dict()
    assert CostModel.from_dict(written) == model
    del written["plain"]["knots"], written["plain"]["knot_slopes"]  # written before the plain knots
    assert CostModel.from_dict(written).plain.knots == ()


def test_analytical_roofline():
    target = ModelShape.from_config(TARGET_CONFIG, "bfloat16")
    assert 7.0e9 < target.matmul_params < 8.1e9  # Llama-3.1-8B without its input embedding
    assert target.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    gpu = gpu_spec("NVIDIA H200")
    assert gpu.name == "H200" and gpu_spec("NVIDIA L40S").name == "L40S"
    assert gpu_spec("Some Future GPU").name.startswith("unknown")
    model = analytical(target, ModelShape.from_config(DRAFT_CONFIG, "bfloat16"), gpu)
    assert model.source == "analytical"
    small, knee, big = (model.verify.time(1, n, 0.0) for n in (8, model.verify.knots[0], 4096))
    assert small == pytest.approx(knee)  # weight bound: flat
    assert big > 3 * small  # compute bound past the knee
    assert 3e-3 < small < 20e-3  # an 8B forward on an H200 takes milliseconds
    assert model.draft.decode_forward < small / 2


# --- allocator --------------------------------------------------------------------


def test_lengthens_when_verify_is_cheap_and_acceptance_high():
    cheap = cost(verify_fixed=20e-3, verify_token=1e-6, forward=0.5e-3)
    assert run_allocate(constant_gains([0.9] * 4, 8), cheap).draft_lens == (8,) * 4


def test_shortens_and_disables_under_load():
    # 64-token compute knee: beyond it every verify token costs a GEMM row.
    loaded = cost(verify_fixed=15e-3, knot=64, slope=0.15e-3, forward=1.5e-3, row=2e-6)
    light = run_allocate(constant_gains([0.7] * 4, 8), loaded)
    heavy = run_allocate(constant_gains([0.7] * 256, 8), loaded)
    assert min(light.draft_lens) >= 2
    assert np.mean(heavy.draft_lens) < 0.5 and heavy.draft_lens.count(0) > 128


def test_respects_k_max():
    free = cost(verify_fixed=50e-3, forward=1e-5)
    assert run_allocate(constant_gains([1.0, 0.99], 3), free).draft_lens == (3, 3)


def test_heterogeneous_acceptance_gives_heterogeneous_lengths():
    model = cost(verify_fixed=15e-3, verify_token=0.2e-3, forward=1.0e-3)
    lens = run_allocate(constant_gains([0.95, 0.8, 0.5, 0.1], 8), model).draft_lens
    assert list(lens) == sorted(lens, reverse=True) and len(set(lens)) >= 3
    assert lens[0] >= 4 and lens[-1] == 0


def test_no_speculation_when_it_cannot_pay():
    slow_draft = cost(verify_fixed=10e-3, forward=50e-3)
    assert run_allocate(constant_gains([0.9] * 8, 5), slow_draft).draft_lens == (0,) * 8
    hopeless = constant_gains([0.0] * 8, 5)
    assert run_allocate(hopeless, cost()).draft_lens == (0,) * 8


def test_drafting_must_beat_the_plain_decode_it_replaces():
    """Drafting that beats a zero-length verify but not the cheaper plain decode is off."""
    gains = constant_gains([0.5] * 8, 4)
    model = cost(verify_fixed=10e-3, forward=1e-3)
    assert sum(run_allocate(gains, model).draft_lens) > 0
    with_plain = replace(model, plain=PlainCost(fixed=6e-3, row=0.0, context_token=0.0))
    a = run_allocate(gains, with_plain)
    assert a.draft_lens == (0,) * 8 and a.step_seconds == pytest.approx(6e-3)


def test_drafts_that_gain_nothing_are_never_chosen():
    """A profile may price a drafting step below the plain decode (here 11 ms against
    20 ms); drafts with no gain (cut near max_new_tokens, or never accepted) still stay
    out, and the prediction is the plain decode the worker then runs."""
    model = replace(cost(verify_fixed=10e-3, forward=1e-3), plain=PlainCost(20e-3, 0.0, 0.0))
    a = run_allocate(constant_gains([0.0] * 8, 4), model)
    assert a.draft_lens == (0,) * 8 and a.step_seconds == pytest.approx(20e-3)
    mixed = run_allocate(constant_gains([0.8, 0.0, 0.8, 0.0], 4), model)
    assert mixed.draft_lens[1] == mixed.draft_lens[3] == 0 and mixed.draft_lens[0] > 0
    capped = constant_gains([0.8] * 2, 4)
    capped[1, 2:] = 0.0  # the worker cuts request 1 to 2 drafts
    assert run_allocate(capped, model).draft_lens[1] <= 2


def test_bound_skips_the_walk_only_when_no_draft_can_pay(monkeypatch):
    """The early exit (for every depth c and n, the n largest gains among positions < c
    over the fastest step with n drafts at most c deep) returns the plain decode exactly
    when the full walk would; near the bound the walk still runs and drafts."""
    import faser_sglang.spec_worker.adaptive.allocator as alloc

    model = replace(cost(verify_fixed=10e-3, forward=1e-3), plain=PlainCost(6e-3, 0.0, 0.0))
    walked = []
    real_best = alloc._Walk.best
    monkeypatch.setattr(alloc._Walk, "best", lambda self, *a: walked.append(1) or real_best(self, *a))
    low = run_allocate(constant_gains([0.3] * 64, 4), model)  # 64 + 27.4 tokens / 11 ms < 64 / 6 ms
    assert low.draft_lens == (0,) * 64 and not walked
    high = run_allocate(constant_gains([0.95] * 64, 4), model)
    assert sum(high.draft_lens) > 0 and walked
    # Under load each verify token costs more than its gain is worth (0.9 tokens for
    # 200 us against 64 tokens per 6 ms plain step, 94 us a token): no draft pays, though
    # every gain at the price of a single verify token would (64 + 207 tokens / 11.2 ms).
    walked.clear()
    dear = replace(cost(verify_fixed=10e-3, verify_token=200e-6, forward=1e-3), plain=PlainCost(6e-3, 0.0, 0.0))
    under_load = run_allocate(constant_gains([0.9] * 64, 4), dear)
    assert under_load.draft_lens == (0,) * 64 and not walked
    # 256 requests on the 7.18B pair's profile, 16 of them accepting nearly every draft:
    # their 128 deep drafts would pay at the price of one draft forward (378 tokens in
    # 16.3 ms against 256 in 11.1 ms), not at the eight forwards that depth takes.
    walked.clear()
    few_good = constant_gains([0.99] * 16 + [0.1] * 240, 8)
    assert run_allocate(few_good, H200_7B).draft_lens == (0,) * 256 and not walked
    monkeypatch.setattr(alloc, "_any_draft_can_pay", lambda *a: True)  # the bound never fires
    assert run_allocate(constant_gains([0.9] * 64, 4), dear).draft_lens == (0,) * 64 and walked
    assert run_allocate(few_good, H200_7B).draft_lens == (0,) * 256


def test_respects_the_verify_token_cap():
    """max_drafts (room the CUDA graphs leave) caps sum k_i; within it the allocator
    still picks the best point, checked against brute force."""
    cheap = cost(verify_fixed=20e-3, verify_token=1e-6, forward=0.5e-3)
    capped = run_allocate(constant_gains([0.9] * 4, 8), cheap, max_drafts=6)
    assert sum(capped.draft_lens) == 6 and max(capped.draft_lens) - min(capped.draft_lens) <= 1
    assert run_allocate(constant_gains([0.9] * 4, 8), cheap, max_drafts=0).draft_lens == (0,) * 4
    rng = np.random.default_rng(1)
    ratios = []
    for _ in range(100):
        model = cost(verify_fixed=rng.uniform(5e-3, 3e-2), verify_token=rng.uniform(0, 5e-5),
                     forward=rng.uniform(1e-3, 4e-3))  # fmt: skip
        bs, k_max, room = 3, 3, int(rng.integers(1, 6))
        gains = np.cumprod(rng.uniform(0.2, 1.0, (bs, k_max)), axis=1)
        seq, catchup = rng.integers(50, 4000, bs), rng.integers(1, 3, bs)
        a = allocate(gains, seq, catchup, model, max_drafts=room)
        assert sum(a.draft_lens) <= room
        best = max(
            (bs + sum(gains[i, :k].sum() for i, k in enumerate(ks))) / model.step_time(ks, seq, catchup)
            for ks in itertools.product(range(k_max + 1), repeat=bs)
            if sum(ks) <= room
        )
        ratios.append(a.tokens_per_second / best)
    assert min(ratios) > 0.95 and np.mean(ratios) > 0.99


def test_in_a_chain_shorter_rows_draft_for_their_verify_tokens_alone():
    """In a chain every drafting row runs to the longest draft, so a weaker request's
    drafts below it cost no draft rows: with dear rows the chain lengthens the weak
    request's drafts, while one forward per step keeps them short."""
    dear_rows = cost(verify_fixed=10e-3, verify_token=0.3e-3, forward=1e-3, row=0.5e-3)
    gains = constant_gains([0.95, 0.6], 4)
    looped = run_allocate(gains, dear_rows)
    chained = allocate(gains, np.full(2, 500), np.ones(2), dear_rows, chained=True)
    assert looped.draft_lens[0] == chained.draft_lens[0] == 4
    assert looped.draft_lens[1] < chained.draft_lens[1] == 4


def test_docstring_example():
    model = cost(verify_fixed=10e-3, knot=2, slope=2e-3, forward=1e-3)
    a = allocate(np.array([[0.9, 0.81], [0.3, 0.09]]), np.zeros(2), np.ones(2), model)
    assert a.draft_lens == (2, 0)
    assert a.tokens_per_second == pytest.approx(3.71 / 0.016)


@pytest.mark.parametrize("chained", [False, True])
def test_near_optimal_against_brute_force(chained):
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        model = CostModel(
            DraftCost(*rng.uniform([1e-3, 1e-3, 0, 0, 0], [4e-3, 4e-3, 2e-5, 2e-5, 1e-8])),
            VerifyCost(*rng.uniform([5e-3, 0, 0, 0], [3e-2, 5e-5, 5e-5, 5e-8]),
                       knots=(float(rng.integers(4, 12)),), knot_slopes=(rng.uniform(0, 2e-3),)),
            "synthetic",
            plain=PlainCost(*rng.uniform([2e-3, 0, 0], [3e-2, 5e-5, 5e-8])) if rng.random() < 0.5 else None,
        )  # fmt: skip
        bs, k_max = 4, 3
        gains = np.cumprod(rng.uniform(0.2, 1.0, (bs, k_max)), axis=1)
        seq, catchup = rng.integers(50, 4000, bs), rng.integers(1, 3, bs)
        pieces = None
        if rng.random() < 0.5:  # catch-ups of up to 3 pieces of 4 tokens, charged in full
            catchup = rng.integers(1, 7, bs)
            pieces = CatchupPieces(catchup.astype(float), piece_tokens=4, horizon=np.ones(bs))
        piece_tokens = None if pieces is None else pieces.piece_tokens
        a = allocate(gains, seq, catchup, model, pieces=pieces, chained=chained)
        assert a.step_seconds == pytest.approx(model.step_time(a.draft_lens, seq, catchup, piece_tokens, chained))
        assert a.expected_tokens == pytest.approx(bs + sum(gains[i, :k].sum() for i, k in enumerate(a.draft_lens)))
        best = max(
            (bs + sum(gains[i, :k].sum() for i, k in enumerate(ks)))
            / model.step_time(ks, seq, catchup, piece_tokens, chained)
            for ks in itertools.product(range(k_max + 1), repeat=bs)
        )
        ratios.append(a.tokens_per_second / best)
    assert min(ratios) > 0.95 and np.mean(ratios) > 0.999


def _random_case(
    rng: np.random.Generator,
    model: CostModel,
    gains: np.ndarray,  # [bs, k_max]
    catchup_high: int,
    horizon_high: int,
    piece_tokens: tuple[int, int],
    pieces_p: float,
) -> tuple[tuple, dict]:
    """allocate()'s arguments for a random batch around ``gains``: catch-up backlogs and
    horizons, pieces of a random size (with probability ``pieces_p``), a draft cap half
    the time, draft steps as one chain half the time."""
    bs, k_max = gains.shape
    catchup = rng.integers(1, catchup_high, bs).astype(float)
    horizon = rng.integers(1, horizon_high, bs).astype(float)
    pieces = CatchupPieces(catchup, int(rng.integers(*piece_tokens)), horizon) if rng.random() < pieces_p else None
    max_drafts = None if rng.random() < 0.5 else int(rng.integers(1, bs * k_max + 1))
    args = (gains, rng.integers(50, 4000, bs), charged_catchup(catchup, horizon), model)
    return args, {"max_drafts": max_drafts, "pieces": pieces, "chained": bool(rng.random() < 0.5)}


def test_pruned_walks_find_the_unpruned_best(monkeypatch):
    """Leaving out the items that cannot raise the best rate never loses the best point: random
    cost models (plain terms dearer than a verify included), catch-ups in pieces with
    mixed horizons, with and without a draft cap."""
    rng = np.random.default_rng(11)
    cases = []
    for _ in range(3000):
        model = CostModel(
            DraftCost(*rng.uniform([1e-3, 1e-3, 0, 0, 0], [4e-3, 4e-3, 2e-5, 2e-5, 1e-8])),
            VerifyCost(*rng.uniform([5e-3, 0, 0, 0], [3e-2, 5e-5, 5e-5, 5e-8]), (8.0,), (rng.uniform(0, 2e-3),)),
            "synthetic",
            plain=PlainCost(*rng.uniform([2e-3, 0, 0], [3e-2, 5e-5, 5e-8])) if rng.random() < 0.5 else None,
        )
        bs, k_max = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        gains = np.cumprod(rng.uniform(0.05, 1.0, (bs, k_max)), axis=1)
        cases.append(_random_case(rng, model, gains, catchup_high=40, horizon_high=64,
                                  piece_tokens=(2, 16), pieces_p=0.7))
    pruned = [allocate(*args, **kw).tokens_per_second for args, kw in cases]
    monkeypatch.setattr(allocator, "_ceilings", lambda gains, priced: np.full(gains.shape, np.inf))
    unpruned = [allocate(*args, **kw).tokens_per_second for args, kw in cases]
    # Never worse; now and then better (a point without the left-out items can beat the
    # unpruned walk's best).
    ratio = np.array(pruned) / np.array(unpruned)
    assert ratio.min() >= 1 - 1e-12 and np.mean(ratio == 1.0) > 0.99


def test_bound_never_hides_a_better_point(monkeypatch):
    """The early exit returns the plain decode only where the walks find nothing better:
    random cost models (plain terms dearer than a verify, knots, free items), batches up
    to 64 with catch-up backlogs, pieces and caps, against the same allocations with the
    bound switched off. A quarter of the cases are loaded enough that it fires."""
    rng = np.random.default_rng(5)

    def prices(low, high, fixed):  # the per-unit ones sometimes exactly 0, as a fit may leave them
        return rng.uniform(low, high) * ((rng.random(len(low)) > 0.2) | (np.arange(len(low)) < fixed))

    cases = []
    for _ in range(2000):
        model = CostModel(
            DraftCost(*prices([1e-3, 1e-3, 0, 0, 0], [4e-3, 4e-3, 2e-5, 3e-5, 1e-8], 2)),
            VerifyCost(*prices([5e-3, 0, 0, 0], [3e-2, 5e-5, 5e-5, 5e-8], 1),
                       (float(rng.integers(8, 256)),), (rng.uniform(0, 1e-4),)),
            "synthetic",
            plain=PlainCost(*prices([2e-3, 0, 0], [3e-2, 5e-5, 5e-8], 1)) if rng.random() < 0.7 else None,
        )  # fmt: skip
        bs, k_max = int(rng.choice([1, 4, 16, 64])), int(rng.integers(1, 9))
        gains = np.cumprod(rng.uniform(0.0, 1.0, (bs, k_max)) ** rng.uniform(0.1, 1.0), axis=1)
        cases.append(_random_case(rng, model, gains, catchup_high=64, horizon_high=32,
                                  piece_tokens=(8, 128), pieces_p=0.5))
    assert 0.2 < _bound_fires_where_walks_agree(monkeypatch, cases, "_any_draft_can_pay") < 0.9


def _bound_fires_where_walks_agree(monkeypatch, cases: list[tuple[tuple, dict]], bound: str) -> float:
    """Allocates ``cases`` with ``allocator.<bound>`` as it is and again with it always
    passing; asserts the same points (it returns the plain decode only where the walks
    find nothing better) and returns the share of cases in which it fired."""
    verdicts = []
    real = getattr(allocator, bound)
    monkeypatch.setattr(allocator, bound, lambda *a: verdicts.append(real(*a)) or verdicts[-1])
    bounded = [allocate(*args, **kw) for args, kw in cases]
    monkeypatch.setattr(allocator, bound, lambda *a: True)
    walked = [allocate(*args, **kw) for args, kw in cases]
    assert all(b.tokens_per_second == pytest.approx(w.tokens_per_second) for b, w in zip(bounded, walked))
    assert len(verdicts) == len(cases)
    return 1 - float(np.mean(verdicts))


def test_profit_bound_alone_never_hides_a_better_point(monkeypatch):
    """The bound that prices each request's drafts with its own costs (_profit_kernel),
    with the gains-apart one switched off, returns the plain decode only where the walks
    find nothing better: random cost models (hinged verify prices, plain terms, per-row
    and per-context draft costs), batches up to 256 with catch-ups in pieces, past
    MAX_CATCHUP_PIECES pieces too, chains, caps."""
    rng = np.random.default_rng(17)
    cases = []
    for _ in range(1200):
        model = CostModel(
            DraftCost(*rng.uniform([1e-3, 1e-3, 0, 0, 0], [4e-3, 4e-3, 3e-5, 3e-5, 1e-8])),
            VerifyCost(*rng.uniform([5e-3, 0, 0, 0], [3e-2, 5e-5, 5e-5, 5e-8]),
                       tuple(np.sort(rng.uniform(8, 512, 2))), tuple(rng.uniform(0, 1e-4, 2))),
            "synthetic",
            plain=PlainCost(*rng.uniform([2e-3, 0, 0], [3e-2, 5e-5, 5e-8])) if rng.random() < 0.7 else None,
        )  # fmt: skip
        bs, k_max = int(rng.choice([1, 4, 16, 64, 256])), int(rng.integers(1, 9))
        gains = np.cumprod(rng.uniform(0.0, 1.0, (bs, k_max)) ** rng.uniform(0.05, 1.0), axis=1)
        cases.append(_random_case(rng, model, gains, catchup_high=int(rng.choice([3, 64])), horizon_high=32,
                                  piece_tokens=(8, 128), pieces_p=0.7))  # fmt: skip
    monkeypatch.setattr(allocator, "_bound_kernel", lambda *a: True)
    assert 0.2 < _bound_fires_where_walks_agree(monkeypatch, cases, "_profit_kernel") < 0.9


def test_profit_bound_rules_out_a_batch_the_gains_apart_bound_passes(monkeypatch):
    """test_allocator_overhead's batch: 256 requests on the 7.18B pair's profile, each
    after a step that accepted 0-8 of 8 drafts, with the usual 1-2 catch-up tokens in
    pieces of 128. The n largest gains taken apart from their requests' catch-ups pass
    the gains-apart bound (their catch-ups priced as the fewest requests' few pieces),
    but every request's drafts priced with its own share of the piece forwards do not
    pay, so neither walk runs; with both bounds off the walks choose no draft either."""
    rng = np.random.default_rng(0)
    bs = 256
    rids = [f"r{i}" for i in range(bs)]
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive"), H200_7B)
    policy.observe(rids, [8] * bs, rng.integers(0, 9, bs).tolist())
    gains = policy.acceptance.gains(rids, 8)
    catchup = rng.integers(1, 3, bs).astype(float)
    pieces = CatchupPieces(catchup, 128, np.full(bs, 16.0))
    seq_lens = rng.integers(100, 4000, bs)
    seen = []  # the bounds' arguments
    real_profit = allocator._profit_kernel
    monkeypatch.setattr(allocator, "_profit_kernel", lambda *a: seen.append(a) or real_profit(*a))
    walked = []
    real_best = allocator._Walk.best
    monkeypatch.setattr(allocator._Walk, "best", lambda self, *a: walked.append(1) or real_best(self, *a))
    assert allocate(gains, seq_lens, catchup, H200_7B, pieces=pieces).draft_lens == (0,) * bs and not walked
    assert allocator._bound_kernel(*seen[0]) and not real_profit(*seen[0])
    monkeypatch.setattr(allocator, "_any_draft_can_pay", lambda *a: True)
    assert allocate(gains, seq_lens, catchup, H200_7B, pieces=pieces).draft_lens == (0,) * bs and walked


@pytest.mark.parametrize("which", ["analytical Llama-3.1-8B / 3.2-1B", "profiled 7.18B pair"])
def test_allocator_overhead(which):
    rng = np.random.default_rng(0)
    model = H200_7B if which.startswith("profiled") else analytical(
        ModelShape.from_config(TARGET_CONFIG, "bfloat16"),
        ModelShape.from_config(DRAFT_CONFIG, "bfloat16"),
        gpu_spec("NVIDIA H200"),
    )  # fmt: skip
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive"), model)
    timings = {}
    for bs in (1, 16, 64, 256):
        rids = [f"r{i}" for i in range(bs)]
        ctx = StepContext(tuple(rng.integers(100, 4000, bs).tolist()), tuple([0] * bs))
        # Catch-ups in pieces of 128 (the draft's decode graphs, as on a GPU): two walks.
        drafted = tuple(n - int(rng.integers(0, 2)) for n in ctx.seq_lens)
        ctx = StepContext(ctx.seq_lens, drafted, catchup_piece_tokens=128)
        policy.observe(rids, [8] * bs, rng.integers(0, 9, bs).tolist())
        policy.choose(rids, 8, ctx)  # warm up
        rounds = []
        for _ in range(5):  # best of 5 rounds: the machine may be running other jobs
            start = time.perf_counter()
            for _ in range(10):
                lens = policy.choose(rids, 8, ctx)
            rounds.append((time.perf_counter() - start) / 10)
        per_step = min(rounds)
        accepted = [min(k, 2) for k in lens]
        start = time.perf_counter()
        policy.observe(rids, lens, accepted)
        observe = time.perf_counter() - start
        step = model.step_time(lens, ctx.seq_lens, ctx.catchup_tokens(), 128)
        timings[bs] = per_step
        print(f"{which}: adaptive choose bs={bs:3d} K_max=8: {per_step * 1e3:.3f} ms, drafts {sum(lens)} "
              f"({100 * per_step / step:.2f}% of the predicted {step * 1e3:.1f} ms step), "
              f"observe {observe * 1e3:.3f} ms")  # fmt: skip
    assert timings[64] < 5e-3


# --- the policy ------------------------------------------------------------------------


def deployment(gpu="NVIDIA H200") -> Deployment:
    return Deployment(
        key=CostKey.of(gpu, "Llama-3.1-8B", "Llama-3.2-1B", "flashinfer", "bfloat16"),
        target_config=TARGET_CONFIG,
        draft_config=DRAFT_CONFIG,
        draft_dtype="bfloat16",
    )


def test_make_policy_adaptive_loads_profiled_or_falls_back(tmp_path, caplog):
    path = tmp_path / "costs.json"
    write_cost_entry(path, deployment().key, KNOWN)
    profiled = make_policy(FaserConfig(policy="adaptive", cost_model_path=str(path)), deployment())
    assert isinstance(profiled, AdaptiveDrafterPolicy) and profiled.cost_model == KNOWN
    with caplog.at_level(logging.WARNING):
        other_gpu = make_policy(FaserConfig(policy="adaptive", cost_model_path=str(path)), deployment("NVIDIA A100"))
    assert other_gpu.cost_model.source == "analytical"
    assert "has no entry" in caplog.text and "ANALYTICAL" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert make_policy(FaserConfig(policy="adaptive"), deployment()).cost_model.source == "analytical"
    assert "ANALYTICAL" in caplog.text
    caplog.clear()
    current = json.loads(path.read_text())
    path.write_text(json.dumps({**current, "format": 1}))
    with caplog.at_level(logging.WARNING):
        assert make_policy(FaserConfig(policy="adaptive", cost_model_path=str(path)), deployment()).cost_model == KNOWN
    assert "Re-profile" in caplog.text and "decode-row pieces" in caplog.text and "plain-decode" in caplog.text
    caplog.clear()
    path.write_text(json.dumps({**current, "format": 2}))
    with caplog.at_level(logging.WARNING):
        make_policy(FaserConfig(policy="adaptive", cost_model_path=str(path)), deployment())
    assert "plain-decode" in caplog.text and "decode-row pieces" not in caplog.text
    # A model the roofline cannot size needs a profile; with one, its config is never read.
    unsized = replace(deployment(), target_config={"model_type": "exotic"})
    with pytest.raises(ValueError, match="profile_costs.py"):
        make_policy(FaserConfig(policy="adaptive"), unsized)
    assert make_policy(FaserConfig(policy="adaptive", cost_model_path=str(path)), unsized).cost_model == KNOWN
    with pytest.raises(ValueError, match="deployment"):
        make_policy(FaserConfig(policy="adaptive"))


def test_adaptive_policy_learns_per_request_lengths():
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive", window=16), KNOWN)
    rids = ["good", "bad"]
    ctx = StepContext((300, 300), (300, 300))
    with pytest.raises(ValueError, match="StepContext"):
        policy.choose(rids, 6)
    assert policy.choose([], 6, StepContext((), ())) == []
    rng = random.Random(0)
    for _ in range(30):
        lens = policy.choose(rids, 6, ctx)
        assert all(0 <= k <= 6 for k in lens)
        # "good" accepts each draft with p = 0.95, "bad" with 0.02.
        accepted = [next((j for j in range(k) if rng.random() > p), k) for k, p in zip(lens, (0.95, 0.02))]
        policy.observe(rids, lens, accepted)
    good, bad = policy.choose(rids, 6, ctx)
    assert good >= 4 and good >= bad
    # Alone, each pays its own draft forwards: only the good request still drafts.
    assert policy.choose(["good"], 6, StepContext((300,), (300,)))[0] >= 4
    assert policy.choose(["bad"], 6, StepContext((300,), (300,))) == [0]
    with pytest.raises(ValueError, match="describes 2 requests"):
        policy.choose(["good"], 6, ctx)
    policy.forget("bad")
    # A new request starts from the pooled prior (mostly the good request's record).
    assert policy.choose(["bad"], 6, StepContext((300,), (300,)))[0] >= 1


def test_adaptive_policy_resumes_drafting_after_an_unlucky_start():
    """Four requests at a time; the first 30 steps' drafts are nearly all rejected, then
    drafts are accepted with p = 0.9. The bad start switches drafting off for everyone
    (rightly); the pool's evidence then ages out over steps without drafts (one entry a
    step) and the re-probed drafts find the good acceptance, so drafting resumes within
    about a pool of steps."""
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive"), KNOWN)
    pool = policy.acceptance.pool_size
    rng = random.Random(1)
    lens: dict[str, list[int]] = {}  # rid -> [committed tokens, draft KV tokens]
    drafted, next_id = [], 0
    for step in range(30 + pool + 100):
        while len(lens) < 4:
            lens[f"r{next_id}"] = [300, 300]
            next_id += 1
        rids = list(lens)
        ks = policy.choose(rids, 6, StepContext(*zip(*(tuple(lens[r]) for r in rids))))
        p = 0.02 if step < 30 else 0.9
        accepted = [next((j for j in range(k) if rng.random() > p), k) for k in ks]
        policy.observe(rids, ks, accepted)
        drafted.append(sum(ks))
        for rid, k, a in zip(rids, ks, accepted):
            lens[rid] = [lens[rid][0] + a + 1, lens[rid][0] + min(k, a + 1) if k else lens[rid][1]]
            if lens[rid][0] > 400:
                policy.forget(rid)
                del lens[rid]
    assert sum(drafted[25:35]) == 0  # the bad start switched drafting off
    assert all(d >= 4 for d in drafted[-20:])  # and it came back


def test_drafting_overhead_times_drafting_steps_that_follow_drafting_steps():
    """Only a drafting step after a drafting step, with no prefill between, is timed:
    after a plain step the host runs ahead and the interval would hold that step's rest."""
    overhead = DraftingOverhead(window=4, min_samples=2)
    overhead.step(0.000, None)  # plain
    overhead.step(0.010, 0.015)  # drafting after plain: not timed
    overhead.step(0.030, 0.015)  # closes the one before: not timed (it followed a plain step)
    assert list(overhead.excess) == [] and overhead.seconds == 0.0
    overhead.step(0.048, None)  # closes the drafting step at 0.030: 18 ms against 15
    assert overhead.excess[-1] == pytest.approx(0.003)
    assert overhead.seconds == 0.0  # fewer than min_samples
    overhead.step(0.060, 0.015)
    overhead.prefill()  # a prefill between: the interval is not timed
    overhead.step(0.090, 0.015)
    overhead.step(0.107, 0.015)  # after the prefill this one follows a drafting step
    overhead.step(0.130, None)  # 23 ms against 15
    assert list(overhead.excess) == pytest.approx([0.003, 0.008])
    assert overhead.seconds == pytest.approx(0.0055)
    for t in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7):  # 100 ms intervals priced at 90: excess 10 ms each
        overhead.step(t, 0.09)
    assert list(overhead.excess) == pytest.approx([0.01] * 4)  # the window keeps the latest 4


def test_drafting_overhead_switches_off_drafts_that_only_paid_on_paper():
    """Drafting pays under the model by a margin smaller than a measured overhead: with the
    overhead priced, the same request decodes plainly."""
    gains = np.array([[0.6, 0.35, 0.2]])
    seq = np.array([300])
    drafted = allocate(gains, seq, np.array([1.0]), H200_14B)
    assert drafted.draft_lens[0] > 0
    # The overhead at which the drafted step's rate falls to the plain step's.
    margin = drafted.expected_tokens * H200_14B.no_draft_time([300]) - drafted.step_seconds
    assert margin > 0
    assert allocate(gains, seq, np.array([1.0]), H200_14B, drafting_overhead=0.5 * margin).draft_lens[0] > 0
    assert allocate(gains, seq, np.array([1.0]), H200_14B, drafting_overhead=1.5 * margin).draft_lens == (0,)


def test_step_calibration_feeds_measured_drafting_steps_to_the_allocator(caplog, monkeypatch):
    monkeypatch.setattr(drafter, "CALIBRATION_LOG_EVERY", 10)
    caplog.set_level(logging.INFO, logger=drafter.__name__)
    calibrated = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive", step_calibration=True), H200_14B)
    assert AdaptiveDrafterPolicy(FaserConfig(policy="adaptive"), H200_14B).overhead is None
    for _ in range(16):
        calibrated.observe(["a"], [3], [2])
    ctx = StepContext((300,), (299,))
    lengths = calibrated.choose(["a"], 3, ctx)
    assert lengths[0] > 0
    predicted = H200_14B.step_time(lengths, ctx.seq_lens, ctx.catchup_tokens())
    t = 0.0
    for _ in range(12):  # every drafting step takes twice its predicted time
        calibrated.step_began(t, lengths, ctx)
        t += 2 * predicted
    assert calibrated.overhead.seconds == pytest.approx(predicted)
    assert calibrated.overhead.measured == 10  # the first two close intervals nothing timed
    assert f"take {1e3 * predicted:.2f} ms more than the cost model predicts" in caplog.text
    assert calibrated.choose(["a"], 3, ctx) == [0]


def test_charged_catchup_spreads_a_backlog_over_the_horizon():
    np.testing.assert_allclose(charged_catchup(np.array([1, 2, 3, 302]), 16), [1, 2, 2 + 1 / 16, 2 + 300 / 16])
    np.testing.assert_allclose(charged_catchup(np.array([1, 302]), 1), [1, 302])
    np.testing.assert_allclose(charged_catchup(np.array([302, 302]), np.array([4.0, 10.0])), [77, 32])


def test_horizon_is_shortened_by_the_tokens_a_request_has_left():
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive", catchup_horizon=64), H200_14B)
    ctx = StepContext((300, 300, 300, 300), (0, 0, 0, 0), remaining_tokens=(200, 10, 0, None))
    gains = np.array([[1.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    # 200 tokens at up to 3 per step: at least 66 steps, more than the horizon; 10 tokens at
    # up to 2 per step: at least 5 steps.
    np.testing.assert_allclose(policy.horizons(ctx, gains), [64, 5, 1, 64])
    np.testing.assert_allclose(policy.horizons(StepContext((300,), (0,)), gains[:1]), [64])
    with pytest.raises(ValueError, match="remaining_tokens"):
        StepContext((1, 2), (1, 2), remaining_tokens=(5,))


def test_a_growing_batch_shortens_the_catchup_horizon():
    """A batch of B requests growing by g a step doubles in B / g steps: catch-ups are
    charged over 1 / (1 / catchup_horizon + g / B) steps; at a steady or shrinking
    batch over catchup_horizon."""
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive", catchup_horizon=16), H200_14B)

    def horizons(batch_sizes):
        for bs in batch_sizes:
            ctx = StepContext((300,) * bs, (0,) * bs)
            policy.choose([f"r{i}" for i in range(bs)], 4, ctx)
        return policy.horizons(ctx, np.zeros((bs, 4)))

    np.testing.assert_allclose(horizons([4] * 5), 16)
    np.testing.assert_allclose(horizons([6, 8, 10, 12]), 1 / (1 / 16 + 2 / 12))  # 4.4 steps
    np.testing.assert_allclose(horizons([13]), 1 / (1 / 16 + 7 / 4 / 13))  # growth over the latest 4 steps
    np.testing.assert_allclose(horizons([13] * 4), 16)
    np.testing.assert_allclose(horizons([10, 8]), 16)


def test_drafts_cut_near_max_new_tokens_are_not_priced():
    """Request a drafts well but has 2 tokens left, so the worker cuts its drafts
    (worker.cap_to_remaining); request b's mediocre drafts pay only alongside a's, whose
    draft forwards they share. Priced with a's cut, b does not draft; priced without it
    and cut afterwards, b would draft alone, at a lower rate than not drafting."""
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive"), H200_14B)
    for i in range(16):
        policy.observe(["a", "b"], [1, 1], [1, 1 if i < 7 else 0])  # b: alpha_0 about 0.47
    seq, remaining = (300, 300), (2, None)
    uncapped = policy.choose(["a", "b"], 6, StepContext(seq, seq))
    cut_after = [min(k, cap) for k, cap in zip(uncapped, draft_caps(remaining, 6))]
    priced = policy.choose(["a", "b"], 6, StepContext(seq, seq, remaining_tokens=remaining))
    assert cut_after[0] == 0 and cut_after[1] > 0 and priced == [0, 0]

    def rate(lens):
        tokens = 2 + sum(policy.acceptance.expected_accepted(r, k) for r, k in zip("ab", lens))
        return tokens / H200_14B.step_time(lens, seq, (1, 1))

    assert rate(priced) > rate(cut_after)
    assert draft_caps([90, 4, 2, None], 5) == [5, 2, 0, 5]


def test_a_lazy_request_drafts_despite_its_prompt_backlog():
    """A new request under lazy draft prefill: its first catch-up feeds its whole
    300-token prompt. Each draft is accepted with p = 0.6 (SGLang's STANDALONE accepted
    0.61 of its first drafts with this pair on HumanEval). Charged in full (horizon 1),
    the catch-up outweighs the step's expected gain and the request would never draft;
    spread over the default horizon, it drafts."""
    ctx = StepContext((300,), (0,))
    config = FaserConfig(policy="adaptive", prior_accept_rate=0.6)
    spread = AdaptiveDrafterPolicy(config, H200_14B)
    at_once = AdaptiveDrafterPolicy(replace(config, catchup_horizon=1), H200_14B)
    assert spread.choose(["new"], 6, ctx)[0] >= 1
    assert at_once.choose(["new"], 6, ctx) == [0]
    # Caught up, both draft: the horizon only changes how the backlog is charged.
    assert at_once.choose(["new"], 6, StepContext((300,), (299,)))[0] >= 1


def test_catch_up_pieces_of_a_backlog_are_charged_over_the_horizon():
    pieces = CatchupPieces(np.array([302.0, 2.0]), piece_tokens=128, horizon=np.array([4.0, 1.0]))
    np.testing.assert_allclose(pieces.backlog_rate, [0.25, 0.0])  # no backlog: no rate
    # F(2) = 1 forward of its own; F(302) = 3, the 2 more are the backlog's: 1 + 2 / 4.
    assert allocator._charged_forwards(2.0, 2.0, 0.0, 128) == pytest.approx(1.0)
    assert allocator._charged_forwards(2.0, 302.0, 0.25, 128) == pytest.approx(1.5)
    # Two backlogs of 300 over 4 and 12 steps: F(4) = 1, F(604) = 5, the 4 more charged at
    # the shorter horizon. Adding the second request never lowers the charge (the walks'
    # pruning needs that): 1 + 2 / 4 alone, 1 + 4 / 4 with it.
    both = CatchupPieces(np.array([302.0, 302.0]), piece_tokens=128, horizon=np.array([4.0, 12.0]))
    rate = both.backlog_rate.max()
    assert allocator._charged_forwards(4.0, 604.0, rate, both.piece_tokens) == pytest.approx(2.0)
    # The allocator charges exactly that: one request with the backlog, horizon 1.
    gains = np.full((1, 4), 0.99) ** np.arange(1, 5)
    seq, catchup = np.array([300]), np.array([301.0])
    whole = CatchupPieces(catchup, piece_tokens=128, horizon=np.ones(1))
    a = allocate(gains, seq, catchup, H200_14B, pieces=whole)
    assert a.draft_lens[0] >= 1
    assert a.step_seconds == pytest.approx(H200_14B.step_time(a.draft_lens, seq, catchup, 128))
    assert a.step_seconds > allocate(gains, seq, catchup, H200_14B).step_seconds  # 3 forwards, not 1


def test_a_lazy_request_drafts_despite_its_backlog_in_pieces():
    """The 300-token prompt's catch-up runs in 3 decode-row pieces of 128 (the draft's
    CUDA graphs); the default horizon still lets the new request draft."""
    policy = AdaptiveDrafterPolicy(FaserConfig(policy="adaptive", prior_accept_rate=0.6), H200_14B)
    assert policy.choose(["new"], 6, StepContext((300,), (0,), catchup_piece_tokens=128))[0] >= 1


def test_deployment_from_runners_with_fake_sglang_objects():
    def runner(config, dtype="torch.bfloat16"):
        return SimpleNamespace(
            gpu_id=0, model_config=SimpleNamespace(dtype=dtype, hf_text_config=SimpleNamespace(**config))
        )

    args = SimpleNamespace(
        model_path="meta-llama/Llama-3.1-8B", speculative_draft_model_path="/m/Llama-3.2-1B", attention_backend=None
    )
    target = runner(TARGET_CONFIG)
    target.prefill_attention_backend_str = "flashinfer"
    dep = deployment_from_runners(args, target, runner(DRAFT_CONFIG))
    assert dep.key.target == "Llama-3.1-8B" and dep.key.draft == "Llama-3.2-1B"
    assert dep.key.attention_backend == "flashinfer" and dep.key.dtype == "bfloat16"
    assert dep.draft_dtype == "torch.bfloat16"
    assert ModelShape.from_config(dep.target_config, dep.key.dtype) == ModelShape.from_config(TARGET_CONFIG, "bfloat16")
    # A draft on a backend of its own has costs of its own.
    args.speculative_draft_attention_backend = "triton"
    assert deployment_from_runners(args, target, runner(DRAFT_CONFIG)).key.attention_backend == "flashinfer/draft:triton"
    args.speculative_draft_attention_backend = "flashinfer"
    assert deployment_from_runners(args, target, runner(DRAFT_CONFIG)).key.attention_backend == "flashinfer"


def test_step_context():
    ctx = StepContext((10, 7), (9, 7))
    assert ctx.catchup_tokens() == (2, 1)
    assert ctx.max_drafts() is None
    assert StepContext((10, 7), (9, 7), max_verify_tokens=5).max_drafts() == 3
    assert StepContext((10, 7), (9, 7), max_verify_tokens=1).max_drafts() is None  # eager anyway
    with pytest.raises(ValueError):
        StepContext((1, 2), (1,))
    # Policies that do not price lengths accept and ignore the context.
    assert FixedLengthPolicy().choose(["a"], 4, ctx) == [4]
    assert EmaLengthPolicy(FaserConfig()).choose(["a"], 4, ctx) == [3]


def test_random_policy_covers_lengths_reproducibly():
    def lengths(seed):
        policy = make_policy(FaserConfig(policy="random", seed=seed))
        return [policy.choose(["a", "b", "c"], 6) for _ in range(10)]

    assert lengths(5) == lengths(5) != lengths(6)
    policy = RandomLengthPolicy(random.Random(0))
    steps = [policy.choose([str(i) for i in range(16)], 6) for _ in range(200)]
    assert all(0 <= k <= 6 for s in steps for k in s)
    assert {max(s) for s in steps} == set(range(7))
    assert any(len(set(s)) > 1 for s in steps)


@pytest.mark.parametrize(
    "data, key",
    [
        ({"window": 0}, "window"),
        ({"window": 2.5}, "window"),
        ({"prior_strength": 0}, "prior_strength"),
        ({"pool_prior_strength": -1.0}, "pool_prior_strength"),
        ({"catchup_horizon": 0}, "catchup_horizon"),
        ({"catchup_horizon": 1.5}, "catchup_horizon"),
        ({"cost_model_path": 3}, "cost_model_path"),
        ({"cost_model_path": "/nonexistent/costs.json"}, "cost_model_path"),
        ({"step_calibration": "yes"}, "step_calibration"),
    ],
)
def test_bad_adaptive_config_names_the_key(data, key):
    with pytest.raises(ValueError, match=key):
        FaserConfig.from_mapping(data)


def test_missing_cost_file_message_names_the_fix():
    with pytest.raises(ValueError, match="profile_costs.py"):
        FaserConfig(cost_model_path="/nonexistent/costs.json")


# --- the profiling script, with a fake server ---------------------------------------------


def load_script():
    spec = importlib.util.spec_from_file_location("profile_costs", REPO / "scripts" / "profile_costs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_profile_script_sweeps_fits_and_saves(tmp_path, monkeypatch, capsys, temperature):
    script = load_script()
    launched = {}
    sent = []  # every batch's sampling parameters

    class FakeServer:
        base_url = "http://fake"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    def fake_launch(model_path, args, env=None, timeout=0.0, log_dir=None):
        launched.update(model=model_path, args=list(args), config=json.loads(Path(env["FASER_CONFIG"]).read_text()))
        return FakeServer()

    step_rng = np.random.default_rng(0)
    policy = RandomLengthPolicy(random.Random(0))

    def fake_replay(base_url, workload, arrivals, sampling):
        """Decode steps of the batch timed by KNOWN (+1% noise), appended to the trace."""
        assert sampling["ignore_eos"] and len(workload) == len(arrivals)
        sent.append(sampling)
        bs = len(workload)
        prompt = 3000 if "excerpt" in workload[0].prompt else 150
        with open(launched["config"]["trace_path"], "a") as trace:
            for step in range(12):
                k = policy.choose(["r"] * bs, 8)
                seq = [prompt + 3 * step] * bs
                kv = [n - int(step_rng.integers(0, 2)) for n in seq]
                catchup = [n - d + 1 for n, d in zip(seq, kv)]
                draft = KNOWN.draft_time(k, seq, catchup) * (1 + 0.01 * step_rng.standard_normal())
                verify = KNOWN.verify_time(k, seq) * (1 + 0.01 * step_rng.standard_normal())
                record = {"draft_lens": k, "seq_lens": seq, "draft_kv_lens": kv,
                          "seconds": draft + verify, "draft_seconds": draft}  # fmt: skip
                trace.write(json.dumps(record) + "\n")
        return ReplayResult([RequestTiming(index=i, arrival=0.0, sent=0.0) for i in range(bs)], [], 0.1)

    monkeypatch.setattr(script, "launch", fake_launch)
    monkeypatch.setattr(script, "replay", fake_replay)
    out = tmp_path / "costs.json"
    model = script.main([
        "--target", "/m/Llama-3.1-8B", "--draft", "/m/Llama-3.2-1B", "--out", str(out),
        "--gpu-name", "NVIDIA H200", "--work-dir", str(tmp_path / "work"),
        "--batch-sizes", "1,4,16,64,256", "--long-batch-sizes", "1,8", "--temperature", str(temperature),
    ])  # fmt: skip
    expected = {"temperature": temperature, "ignore_eos": True, **({"top_p": 0.95} if temperature else {})}
    assert sent and all(s == expected for s in sent)
    assert launched["config"]["policy"] == "random" and launched["config"]["draft_prefill"] == "eager"
    assert "--max-running-requests" in launched["args"] and "256" in launched["args"]
    printed = capsys.readouterr().out
    assert "held-out MAPE" in printed and "draft and verify fitted apart" in printed
    assert model.num_samples == 7 * 12  # the warm-up batch's steps are dropped
    assert model.holdout_mape < 0.05
    key = CostKey.of("NVIDIA H200", "Llama-3.1-8B", "Llama-3.2-1B", "flashinfer", "bfloat16")
    assert read_cost_entries(out)[0][key] == model
