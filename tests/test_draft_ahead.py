"""Drafting ahead (draft_ahead.py): the next step's chain queued behind this step's accept.

Unit tests of the pieces (gap bounds, predicted context, the drafts following their rows
through SGLang's batch filtering and merging, the KV reservation hooks, the startup
checks) and live CPU servers: the target as its own draft accepts every token drafted
ahead, and greedy output equals the server without speculation on both schedules, with
sampling requests joining a batch that drafts ahead, and after aborts.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    H200_14B,
    PROMPTS,
    assert_tokens_follow_target,
    catchup_gaps,
    generate_sampled_mix,
    ids,
    read_trace,
    write_faser_config,
)
from faser_sglang import kv_reserve
from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.adaptive.cost_model import CostKey, write_cost_entry
from faser_sglang.spec_worker.draft_ahead import (
    AheadDrafts,
    forced_gap_bounds,
    predicted_context,
    rows_to_catch_up,
    upper_seq_lens,
)
from faser_sglang.spec_worker.policy import StepContext
from faser_sglang.spec_worker.state import FaserDraftState
from faser_sglang.spec_worker.validation import validate_server_args
from fuzz_utils import faser_flags
from server_utils import abort_streams_and_wait_for_free_kv, generate, generate_each, launch_server

K_MAX = 4
GREEDY = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}


# Pieces ---------------------------------------------------------------------


def test_ahead_reserve_covers_the_chain_past_a_lagging_committed_length():
    # The chain drafted ahead writes up to L + 2 K + MAX_FORCED_GAP; SGLang's recorded
    # committed length may lag L by K + 1, so the reservation spans both.
    for k in (2, 3, 7):
        lag, furthest = k + 1, 2 * k + kv_reserve.MAX_FORCED_GAP
        assert kv_reserve.ahead_reserve(k) == lag + furthest + 1
        assert kv_reserve.ahead_reserve(k) > 2 * (k + 1)  # more than SGLang's own


def test_forced_gap_bounds():
    # A chain row that drafted the longest (k = e) lags 1 if all were accepted; a shorter
    # one never lags; a plain row (k = 0) lags exactly 1 + its current lag.
    assert forced_gap_bounds([3, 1, 0, 0], [10, 10, 10, 10], [13, 13, 10, 9]) == [1, 0, 1, 2]


def test_rows_to_catch_up_are_rows_back_from_plain_steps():
    # Row 1 sat out steps (3 committed tokens unseen by the draft, 4 after this step) and
    # drafts next: caught up ahead. Row 0's draft is current, so it will lag one token,
    # which the chain feeds; row 2 drafted this step (at most one token behind after it);
    # row 3 lags but does not draft next.
    assert rows_to_catch_up([0, 0, 3, 0], [10, 10, 10, 10], [10, 7, 13, 5], [2, 2, 2, 0]) == [1]
    assert rows_to_catch_up([0, 0], [10, 10], [0, 10], [3, 3]) == [0]  # a lazily prefilled request
    assert rows_to_catch_up([0, 0], [10, 10], [10, 9], [3, 3]) == [1]  # two plain steps in a row
    assert rows_to_catch_up([3, 1], [10, 10], [13, 11], [3, 3]) == []


def test_predicted_context_bounds_the_next_step():
    context = StepContext((10, 20), (10, 18), 64, 8, (100, 5), True)
    upper = upper_seq_lens(context.seq_lens, [3, 0])
    assert upper == [14, 21]  # every draft accepted, plus the correction
    nxt = predicted_context(context, upper, [13, 18], [96, 4])
    assert nxt.seq_lens == (14, 21)
    assert nxt.draft_kv_lens == (13, 18)
    assert nxt.remaining_tokens == (96, 4)
    assert (nxt.max_verify_tokens, nxt.catchup_piece_tokens, nxt.chained) == (64, 8, True)


def _ahead(rows: list[list[int]], lengths: list[int], fed: list[int], probs=None) -> AheadDrafts:
    return AheadDrafts(torch.tensor(rows, dtype=torch.int64), probs, lengths, fed)


def test_ahead_drafts_follow_their_rows_through_filter_and_merge():
    state = FaserDraftState([13, 7, 22])
    state.ahead = _ahead([[1, 2, 0], [0, 0, 0], [5, 6, 7]], [2, 0, 3], [3, 0, 3])
    state.filter_batch(torch.tensor([2, 0]), [2, 0])
    assert state.draft_kv_bound == [22, 13]
    assert state.ahead.tokens.tolist() == [[5, 6, 7], [1, 2, 0]]
    assert (state.ahead.lengths, state.ahead.fed) == ([3, 2], [3, 3])

    joined = FaserDraftState([4])  # a prefill's rows draft for themselves
    state.merge_batch(joined)
    assert state.draft_kv_bound == [22, 13, 4]
    assert state.ahead.tokens.tolist() == [[5, 6, 7], [1, 2, 0], [0, 0, 0]]
    assert (state.ahead.lengths, state.ahead.fed) == ([3, 2, 0], [3, 3, 0])


def test_merging_onto_a_batch_without_drafts_ahead():
    state = FaserDraftState([5, 6])
    other = FaserDraftState([9])
    other.ahead = _ahead([[4, 4]], [2], [2])
    state.merge_batch(other)
    assert state.ahead.tokens.tolist() == [[0, 0], [0, 0], [4, 4]]
    assert (state.ahead.lengths, state.ahead.fed) == ([0, 0, 2], [0, 0, 2])
    plain = FaserDraftState([1])
    plain.merge_batch(FaserDraftState([2]))
    assert plain.ahead is None


def test_the_q_of_sampled_drafts_follows_its_rows():
    q = torch.rand(2, 2, 5)  # [bs, K, V]
    state = FaserDraftState([3, 4])
    state.ahead = _ahead([[1, 2], [3, 0]], [2, 1], [2, 2], probs=q)
    state.filter_batch(torch.tensor([1]), [1])
    assert torch.equal(state.ahead.probs, q[1:])
    state.merge_batch(FaserDraftState([7]))  # a row without drafts: zero q
    assert torch.equal(state.ahead.probs, torch.cat([q[1:], torch.zeros(1, 2, 5)]))
    greedy = FaserDraftState([9])
    greedy.ahead = _ahead([[5, 5]], [2], [2])
    greedy.merge_batch(state)
    assert torch.equal(greedy.ahead.probs, torch.cat([torch.zeros(1, 2, 5), q[1:], torch.zeros(1, 2, 5)]))


def _server_args(algorithm="FASER", k=3, **extra):
    fields = dict(
        speculative_algorithm=algorithm,
        speculative_num_steps=k,
        speculative_draft_model_path="draft",
        speculative_eagle_topk=None,
        enable_deterministic_inference=False,
        attention_backend="flashinfer",
        prefill_attention_backend=None,
        decode_attention_backend=None,
        speculative_draft_attention_backend="triton",
        enable_dp_attention=False,
        pp_size=1,
        speculative_adaptive=False,
    )
    fields.update(extra)
    return SimpleNamespace(**fields)


def test_reservation_hooks_raise_sglang_numbers_only_for_a_server_drafting_ahead(tmp_path, monkeypatch):
    kv_reserve._config.cache_clear()
    sglang_reserve = lambda server_args=None: 8  # noqa: E731  SGLang's 2 (K + 1) at K = 3
    sglang_extra = lambda server_args: 8  # noqa: E731
    monkeypatch.delenv("FASER_CONFIG", raising=False)
    assert kv_reserve.reserve_per_decode(sglang_reserve, _server_args()) == 8  # draft_ahead off
    env = write_faser_config(tmp_path / "ahead.json", draft_ahead=True)
    monkeypatch.setenv("FASER_CONFIG", env["FASER_CONFIG"])
    assert kv_reserve.reserve_per_decode(sglang_reserve, _server_args()) == 12
    assert kv_reserve.extra_context_len(sglang_extra, _server_args(k=7)) == 24
    assert kv_reserve.reserve_per_decode(sglang_reserve, _server_args(algorithm="EAGLE")) == 8
    assert kv_reserve.reserve_per_decode(sglang_reserve, _server_args(algorithm=None)) == 8


def test_config_refuses_drafting_ahead_without_chains():
    with pytest.raises(ValueError, match="draft_ahead.*draft_chain"):
        FaserConfig(draft_ahead=True, draft_chain=False)
    with pytest.raises(ValueError, match="draft_ahead"):
        FaserConfig(draft_ahead="yes")


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"speculative_draft_attention_backend": "flashinfer"}, "triton"),
        ({"speculative_draft_attention_backend": None}, "flashinfer"),
        ({"speculative_num_steps": 1}, "K_max >= 2"),
    ],
    ids=["flashinfer-draft", "target-backend-flashinfer", "k1"],
)
def test_startup_refuses_drafting_ahead_it_cannot_serve(tmp_path, monkeypatch, extra, match):
    env = write_faser_config(tmp_path / "ahead.json", draft_ahead=True)
    monkeypatch.setenv("FASER_CONFIG", env["FASER_CONFIG"])
    validate_server_args(_server_args())  # a Triton draft beside a FlashInfer target, K_max 3
    with pytest.raises(ValueError, match=match):
        validate_server_args(_server_args(**extra))


# Live CPU servers -------------------------------------------------------------


def launch_faser(target, draft, env: dict[str, str], *extra_args: str):
    return launch_server(target, *faser_flags(draft, K_MAX), *extra_args, env=env)


@pytest.fixture(scope="module")
def nospec(tiny_models):
    with launch_server(tiny_models.target) as server:
        yield server


@pytest.fixture(scope="module")
def reference(nospec):
    return ids(generate(nospec.base_url, PROMPTS, GREEDY))


def a_plain_step_drafted_ahead(steps: list[dict]) -> bool:
    """Whether a plain step (nobody drafted) queued the chain of the step after it, over
    the same requests."""
    return any(
        not any(s["draft_lens"]) and n.get("draft_steps") == "ahead" and s["rids"] == n["rids"]
        for s, n in zip(steps, steps[1:])
    )


def _staggered(base_url: str) -> list[dict]:
    """Each prompt its own request, all at once, each with its own max_new_tokens: near
    their limits requests draft fewer tokens than the others (worker.cap_to_remaining)."""
    params = [{"max_new_tokens": 24 + 5 * i, "temperature": 0, "ignore_eos": True} for i in range(len(PROMPTS))]
    return generate_each(base_url, PROMPTS, params)


@pytest.mark.server
@pytest.mark.parametrize("policy", ["fixed", "random"])
def test_self_draft_accepts_every_token_drafted_ahead(tiny_models, tmp_path, policy):
    """The tiny target as its own draft: every draft is accepted iff each chain drafted
    ahead started at the right position with the right forced tokens, which the device
    derived from the accept lengths (a row that accepted every draft of the chain's
    longest length lags one token, the others none), and drafted the right tokens for
    rows of different lengths. With random lengths (k = 0 included) rows that sat out
    steps lag further; the step before the one that drafts them catches them up, a
    plain step (nobody drafted) too, so only a step after a prefill drafts for itself.
    A request alone then meets plain steps often (each one has k = 0 in 1 of 5 steps)."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(
        tmp_path / "faser.json", policy=policy, trace_path=str(trace), seed=7, draft_ahead=True
    )
    with launch_faser(tiny_models.target, tiny_models.target, env) as server:
        outs = _staggered(server.base_url)
        if policy == "random":
            generate(server.base_url, PROMPTS[:1], {**GREEDY, "max_new_tokens": 96})
        log = server.log_tail(2_000_000)
    assert [len(o["output_ids"]) for o in outs] == [24 + 5 * i for i in range(len(PROMPTS))]
    assert f"reserves {kv_reserve.ahead_reserve(K_MAX)} KV slots" in log
    steps = read_trace(trace)
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)
    how = Counter(s.get("draft_steps") for s in steps)
    assert how["ahead"] > 0 and how["chain"] > 0, how
    ahead = [s for s in steps if s.get("draft_steps") == "ahead"]
    if policy == "fixed":  # rows near their limits draft less than the chain's longest
        assert any(len({k for k in s["draft_lens"] if k}) > 1 for s in ahead)
    else:  # rows that lag 0 and 1 tokens in one chain drafted ahead
        assert any(set(catchup_gaps([s])) == {0, 1} for s in ahead)
        # Rows back after sitting out steps (lagging more than the chain feeds) were
        # caught up at the end of the step before, and the next step verified drafts
        # made ahead for them.
        assert any(
            s.get("ahead_catchup_rows")
            and n.get("draft_steps") == "ahead"
            and max(catchup_gaps([n]), default=0) > kv_reserve.MAX_FORCED_GAP
            for s, n in zip(steps, steps[1:])
        )
        assert a_plain_step_drafted_ahead(steps)
        assert how["ahead"] > how["chain"] + how["none"], how


@pytest.mark.server
@pytest.mark.parametrize("policy", ["fixed", "random"])
def test_sampled_self_draft_accepts_every_token_drafted_ahead(tiny_models, tmp_path, policy):
    """The tiny target as its own draft, sampling, greedy and logit-biased requests in
    one batch: a sampled draft passes with probability min(1, p(d) / q(d)), 1 only if
    the chain drafted ahead kept the target's own transform of the biased logits at
    the right positions as q, and carried it to the next step's rejection sampling.
    With random lengths a sampled request alone then meets plain steps, which queue
    the sampled chain of the step after them."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy=policy, trace_path=str(trace), seed=11, draft_ahead=True)
    with launch_faser(tiny_models.target, tiny_models.target, env) as server:
        outs = generate_sampled_mix(server.base_url)
        if policy == "random":
            alone = {"max_new_tokens": 96, "temperature": 0.9, "top_p": 0.9, "ignore_eos": True}
            assert len(generate(server.base_url, PROMPTS[:1], alone)[0]["output_ids"]) == 96
    assert all(len(o["output_ids"]) == 40 for o in outs)
    steps = read_trace(trace)
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)
    assert Counter(s.get("draft_steps") for s in steps)["ahead"] > 0
    if policy == "random":
        assert a_plain_step_drafted_ahead(steps)


@pytest.mark.server
@pytest.mark.parametrize("policy, together", [("fixed", 50), ("random", 2)])
def test_sampled_tokens_drafted_ahead_follow_target_distribution(tiny_models, tmp_path, policy, together):
    """Sampled requests of 12 tokens at K_max 4: a request's first verify step drafts
    for itself, the next ones verify drafts a chain drafted ahead, so with the fixed
    policy the tokens at positions 5 and 6 (and mostly 3) were drafted ahead, accepted
    or replaced by rejection sampling against the q the chain kept: each follows the
    target's marginal. With random lengths two requests at a time meet plain steps,
    which queue the sampled chain of the drafting step after them."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy=policy, trace_path=str(trace), seed=5, draft_ahead=True)
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        assert_tokens_follow_target(
            tiny_models, server.base_url, positions=(3, 5, 6), max_new_tokens=12, together=together
        )
    steps = read_trace(trace)
    ahead = [s for s in steps if s.get("draft_steps") == "ahead"]
    assert sum(sum(s["draft_lens"]) for s in ahead) >= 400, "few drafts were drafted ahead"
    accepted = sum(sum(s["num_accepted"]) for s in ahead)
    assert 0 < accepted < sum(sum(s["draft_lens"]) for s in ahead), "the draft should be neither exact nor useless"
    if policy == "random":
        assert a_plain_step_drafted_ahead(steps)


@pytest.mark.server
@pytest.mark.parametrize(
    "policy, server_args",
    [("adaptive", ()), ("fixed", ("--disable-overlap-schedule",)), ("random", ("--disable-overlap-schedule",))],
    ids=["adaptive-overlap", "fixed-synchronous", "random-synchronous"],
)
def test_greedy_equals_no_speculation_drafting_ahead(tiny_models, tmp_path, nospec, reference, policy, server_args):
    """The adaptive policy (with step calibration) chooses the lengths drafted ahead from
    the predicted context, priced by the 13.5B pair's H200 costs so that drafting pays
    (lazy draft prefill: a request's first draft catches its prompt up, then the chain
    drafted ahead takes over); the fixed one on SGLang's synchronous schedule; random
    lengths (k = 0 included) there too, so rows back after plain steps are caught up
    at the end of the step before, and a request alone meets plain steps, which queue
    the chain of the drafting step after them."""
    trace = tmp_path / "trace.jsonl"
    fields = {"seed": 5} if policy == "random" else {}
    if policy == "adaptive":
        costs = tmp_path / "costs.json"
        key = CostKey.of("cpu", str(tiny_models.target), str(tiny_models.draft), "intel_amx", "float32")
        write_cost_entry(costs, key, H200_14B)
        fields["cost_model_path"] = str(costs)
        fields["step_calibration"] = True  # as the A/B's FASER-AD drafting ahead runs
    env = write_faser_config(
        tmp_path / "faser.json", policy=policy, trace_path=str(trace), draft_ahead=True, **fields
    )
    alone = {**GREEDY, "max_new_tokens": 96}
    with launch_faser(tiny_models.target, tiny_models.draft, env, *server_args) as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        if policy == "random":
            expected = ids(generate(nospec.base_url, PROMPTS[:1], alone))
            assert ids(generate(server.base_url, PROMPTS[:1], alone)) == expected
    steps = read_trace(trace)
    how = Counter(s.get("draft_steps") for s in steps)
    assert how["ahead"] > 0, how
    if policy == "random":
        assert any(s.get("ahead_catchup_rows") for s in steps)
        assert a_plain_step_drafted_ahead(steps)


@pytest.fixture(scope="module")
def ahead_trace(tmp_path_factory):
    return tmp_path_factory.mktemp("ahead-trace") / "trace.jsonl"


@pytest.fixture(scope="module")
def ahead_server(tiny_models, tmp_path_factory, ahead_trace):
    env = write_faser_config(
        tmp_path_factory.mktemp("ahead") / "faser.json", policy="fixed", draft_ahead=True, trace_path=str(ahead_trace)
    )
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        yield server


@pytest.mark.server
def test_sampling_and_logprob_requests_joining_a_batch_that_drafts_ahead(ahead_server, ahead_trace, reference):
    """Sampled requests and one that wants logprobs arrive while greedy ones draft
    ahead: a sampled request verifies one token in the step it joins, then drafts ahead
    through the sampled chain; steps that carry the logprob request draft for themselves.
    The greedy output is unchanged."""
    sampled = {"max_new_tokens": 24, "temperature": 0.8, "top_p": 0.9, "ignore_eos": True}
    results: dict[str, list] = {}

    def greedy():
        results["greedy"] = generate(ahead_server.base_url, PROMPTS, GREEDY)

    thread = threading.Thread(target=greedy)
    thread.start()
    time.sleep(0.5)
    results["sampled"] = generate(ahead_server.base_url, PROMPTS[:4], sampled)
    results["logprobs"] = generate(
        ahead_server.base_url, PROMPTS[:1], {**GREEDY, "max_new_tokens": 8}, extra={"return_logprob": True}
    )
    thread.join()
    assert ids(results["greedy"]) == reference
    assert all(len(o["output_ids"]) == 24 for o in results["sampled"])
    assert len(results["logprobs"][0]["meta_info"]["output_token_logprobs"]) == 8
    assert any(s.get("draft_steps") == "ahead" for s in read_trace(ahead_trace))


@pytest.mark.server
def test_abort_while_drafting_ahead_frees_kv(ahead_server, reference):
    abort_streams_and_wait_for_free_kv(ahead_server.base_url, PROMPTS[3])
    assert ids(generate(ahead_server.base_url, PROMPTS, GREEDY)) == reference
