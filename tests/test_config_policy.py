"""FaserConfig validation and the per-request length policies."""

import json

import pytest

from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.policy import EmaLengthPolicy, FixedLengthPolicy, make_policy, step_accept_rate


def test_defaults_need_no_file(monkeypatch):
    monkeypatch.delenv("FASER_CONFIG", raising=False)
    assert FaserConfig.from_env() == FaserConfig()


def test_json_and_toml(tmp_path, monkeypatch):
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"policy": "fixed", "seed": 3}))
    monkeypatch.setenv("FASER_CONFIG", str(j))
    assert FaserConfig.from_env() == FaserConfig(policy="fixed", seed=3)
    t = tmp_path / "c.toml"
    t.write_text('ema_alpha = 0.5\ntrace_path = "/tmp/x.jsonl"\n')
    assert FaserConfig.from_file(t).ema_alpha == 0.5


@pytest.mark.parametrize(
    "data, key",
    [
        ({"polcy": "ema"}, "polcy"),
        ({"policy": "best"}, "policy"),
        ({"ema_alpha": 0}, "ema_alpha"),
        ({"ema_alpha": 1.5}, "ema_alpha"),
        ({"prior_accept_rate": -0.1}, "prior_accept_rate"),
        ({"min_token_value": 1.0}, "min_token_value"),
        ({"seed": "x"}, "seed"),
        ({"ema_alpha": True}, "ema_alpha"),
        ({"ema_alpha": float("nan")}, "ema_alpha"),
        ({"min_token_value": float("nan")}, "min_token_value"),
        ({"prior_strength": float("nan")}, "prior_strength"),
        ({"trace_path": "/nonexistent-dir/trace.jsonl"}, "trace_path"),
        ({"draft_prefill": "later"}, "draft_prefill"),
        ({"draft_chain": "yes"}, "draft_chain"),
        ({"draft_chain": 1}, "draft_chain"),
    ],
)
def test_bad_values_name_the_key(data, key):
    with pytest.raises(ValueError, match=key):
        FaserConfig.from_mapping(data)


def test_draft_prefill_auto_is_lazy_for_the_adaptive_policy_only():
    assert FaserConfig(policy="adaptive").lazy_draft_prefill
    assert not FaserConfig(policy="ema").lazy_draft_prefill
    assert FaserConfig(policy="ema", draft_prefill="lazy").lazy_draft_prefill
    assert not FaserConfig(policy="adaptive", draft_prefill="eager").lazy_draft_prefill


def test_missing_or_unparsable_file(tmp_path):
    with pytest.raises(ValueError, match="does not name a file"):
        FaserConfig.from_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot parse"):
        FaserConfig.from_file(bad)


def test_step_accept_rate():
    assert step_accept_rate(4, 4) == 1.0
    assert step_accept_rate(4, 0) == 0.0
    assert step_accept_rate(4, 1) == 0.5


def test_ema_policy_lengthens_high_acceptance_and_disables_low():
    pol = EmaLengthPolicy(FaserConfig(ema_alpha=0.5, prior_accept_rate=0.7, min_token_value=0.25))
    assert pol.choose(["a"], 8) == [3]  # 0.7**3 = 0.34 >= 0.25 > 0.7**4
    for _ in range(10):
        pol.observe(["a", "b"], [4, 4], [4, 0])
    good, bad = pol.choose(["a", "b"], 8)
    assert good == 8 and bad == 0


def test_ema_policy_respects_k_max_and_reprobes():
    pol = EmaLengthPolicy(FaserConfig(ema_alpha=0.5))
    pol.rates["r"] = 0.0
    assert pol.choose(["r"], 4) == [0]
    for _ in range(30):
        pol.observe(["r"], [0], [0])
    assert pol.choose(["r"], 4)[0] > 0  # relaxed back toward the prior
    pol.rates["r"] = 1.0
    assert pol.choose(["r"], 4) == [4]
    pol.forget("r")
    assert "r" not in pol.rates


def test_make_policy():
    assert isinstance(make_policy(FaserConfig(policy="fixed")), FixedLengthPolicy)
    assert FixedLengthPolicy().choose(["a", "b"], 6) == [6, 6]
