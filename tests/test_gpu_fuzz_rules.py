"""The GPU fuzzer's judging rules, without a GPU: the reference request of a
deterministic case asks for top-2 log-probs; a divergence is located and sized."""

from __future__ import annotations

from gpu.test_gpu_faser import is_near_tie
from gpu.test_gpu_fuzz import divergence, with_top2
from test_fuzz_differential import FuzzCase


def case(**params) -> FuzzCase:
    payload = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, **params}}
    return FuzzCase(seed=0, index=0, payload=payload, delay=0.0)


def test_reference_of_a_deterministic_case_asks_for_top2():
    greedy = with_top2(case(temperature=0))
    assert greedy.payload["return_logprob"] is True and greedy.payload["top_logprobs_num"] == 2
    wide = with_top2(FuzzCase(0, 0, {**case(temperature=0).payload, "top_logprobs_num": 5}, 0.0))
    assert wide.payload["top_logprobs_num"] == 5
    sampled = case(temperature=0.8, top_k=5)
    assert with_top2(sampled) is sampled
    argmax = with_top2(case(temperature=0.8, top_k=1))  # log-probs in logit units
    assert argmax.payload["sampling_params"] == {"max_new_tokens": 4, "temperature": 0, "top_k": 1}


def out(ids, top=None):
    return {"output_ids": ids, "meta_info": {"output_top_logprobs": top}}


def test_divergence_is_located_and_sized():
    top = [[[-0.1, 7, "a"], [-2.0, 8, "b"]], [[-0.50, 3, "c"], [-0.5625, 9, "d"]]]
    assert divergence(out([7, 3]), out([7, 3], top)) is None
    flip = divergence(out([7, 9]), out([7, 3], top))
    assert flip == {"position": 1, "margin": 0.0625, "runner_up": True}
    assert is_near_tie(flip, logit_ulp=0.0625)
    assert not is_near_tie(divergence(out([8, 3]), out([7, 3], top)), logit_ulp=0.0625)  # margin 1.9
    shorter = divergence(out([7]), out([7, 3], top))  # a stop or length difference
    assert shorter["position"] == 1 and not is_near_tie(shorter, logit_ulp=0.0625)
    unjudged = divergence(out([7, 9]), out([7, 3], top[:1]))  # no top-2 at the split
    assert not is_near_tie(unjudged, logit_ulp=0.0625)
