"""Request guard and the remaining-tokens cap, without a server."""

from array import array
from types import SimpleNamespace

import pytest

from faser_sglang.request_guard import guard_validate, request_error, unsupported_feature
from faser_sglang.spec_worker.worker import cap_to_remaining, remaining_tokens

VOCAB = 512


def sp(**kw):
    base = dict(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0,
                json_schema=None, regex=None, ebnf=None, structural_tag=None, n=1)
    return SimpleNamespace(**{**base, **kw})


def req(**kw):
    base = dict(sampling_params=sp(), input_ids=array("q", [1, 2, 3]), return_logprob=False,
                logprob_start_len=-1, top_logprobs_num=0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "params, feature",
    [
        (dict(frequency_penalty=0.5), "frequency_penalty"),
        (dict(presence_penalty=-0.5), "presence_penalty"),
        (dict(repetition_penalty=1.5), "repetition_penalty"),
        (dict(min_new_tokens=3), "min_new_tokens"),
        (dict(regex="a+"), "regex"),
        (dict(json_schema="{}"), "json_schema"),
    ],
)
def test_unsupported_features_are_named(params, feature):
    assert feature in unsupported_feature(sp(**params))
    assert "FASER does not support" in request_error(req(sampling_params=sp(**params)), VOCAB)


def test_custom_logit_processor_is_refused():
    """FASER's own sampling would skip it while SGLang's sampler applies it on steps
    without drafts: refused rather than applied on some tokens only."""
    message = request_error(req(custom_logit_processor='{"callable": "..."}'), VOCAB)
    assert "FASER does not support custom_logit_processor" in message
    assert request_error(req(custom_logit_processor=None), VOCAB) is None


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(input_ids=array("q", [1, 99999])), "input_ids"),
        (dict(input_ids=array("q", [1, -3])), "input_ids"),
        (dict(return_logprob=True, logprob_start_len=-5), "logprob_start_len"),
        (dict(return_logprob=True, top_logprobs_num=100000), "top_logprobs_num"),
        (dict(sampling_params=sp(n=0)), "n must be"),
    ],
)
def test_crashing_values_are_refused(fields, message):
    assert message in request_error(req(**fields), VOCAB)


def test_plain_requests_pass():
    assert request_error(req(), VOCAB) is None
    assert request_error(req(return_logprob=True, top_logprobs_num=5, logprob_start_len=0), VOCAB) is None
    assert request_error(SimpleNamespace(), VOCAB) is None  # not a generate request


def test_cap_to_remaining():
    # Emitted tokens are counted from the committed length (seq_len + 1 - prompt): under
    # the overlap schedule output_ids lags a step behind, so it is left empty here.
    limits_done = [(100, 10), (9, 5), (9, 7), (9, 8), (None, 50)]
    reqs = [
        SimpleNamespace(sampling_params=SimpleNamespace(max_new_tokens=m), origin_input_ids=[1, 2, 3], output_ids=[])
        for m, _ in limits_done
    ]
    seq_lens = [3 + done - 1 for _, done in limits_done]
    # remaining 90 -> uncapped; 4 -> k <= 2; 2 -> k = 0; 1 -> k = 0; no limit -> uncapped
    assert remaining_tokens(reqs, seq_lens) == [90, 4, 2, 1, None]
    assert cap_to_remaining([5, 5, 5, 5, 5], remaining_tokens(reqs, seq_lens)) == [5, 2, 0, 0, 5]


def test_type_errors_in_sglang_checks_become_value_errors_on_faser_only():
    def sglang_check(manager, obj):
        return obj["max_new_tokens"] + 3  # SGLang adds the prompt length: TypeError for a string

    faser = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="FASER"))
    other = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=None))
    assert guard_validate(sglang_check, faser, {"max_new_tokens": 2}) == 5
    with pytest.raises(ValueError, match="invalid request parameter"):
        guard_validate(sglang_check, faser, {"max_new_tokens": "ten"})
    with pytest.raises(TypeError):
        guard_validate(sglang_check, other, {"max_new_tokens": "ten"})
