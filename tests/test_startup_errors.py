"""Configurations FASER cannot serve are refused at startup with a message that
names the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from conftest import write_faser_config
from server_utils import launch_server

pytestmark = pytest.mark.server


def _refused(model, *args, env=None) -> str:
    with pytest.raises(RuntimeError) as info:
        launch_server(model, *args, env=env, timeout=240).close()
    return str(info.value)


def _faser(draft) -> tuple[str, ...]:
    return ("--speculative-algorithm", "FASER", "--speculative-draft-model-path", str(draft))


def test_missing_draft_path(tiny_models):
    log = _refused(tiny_models.target, "--speculative-algorithm", "FASER")
    assert "FASER needs a draft model" in log and "--speculative-draft-model-path" in log


@pytest.mark.parametrize("steps", ["0", "33"])
def test_k_max_out_of_range(tiny_models, steps):
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), "--speculative-num-steps", steps)
    assert "--speculative-num-steps is FASER's maximum draft length" in log


def test_tree_drafts_refused(tiny_models):
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), "--speculative-eagle-topk", "4")
    assert "--speculative-eagle-topk must be 1" in log


def test_unsupported_attention_backend(tiny_models):
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), "--attention-backend", "torch_native")
    assert "FASER does not support --attention-backend torch_native" in log
    assert "flashinfer" in log


def test_unsupported_draft_attention_backend(tiny_models):
    args = ("--speculative-draft-attention-backend", "torch_native")
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), *args)
    assert "FASER does not support --speculative-draft-attention-backend torch_native" in log
    assert "target's backend" in log


def test_deterministic_inference_refused(tiny_models):
    # triton: a backend SGLang accepts for deterministic inference (it refuses the CPU
    # default intel_amx itself, before FASER's check runs).
    args = ("--enable-deterministic-inference", "--attention-backend", "triton")
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), *args)
    assert "FASER does not support --enable-deterministic-inference" in log
    assert "serve without speculation" in log


def test_bad_faser_config(tiny_models, tmp_path):
    env = write_faser_config(tmp_path / "bad.json", ema_alpha=2.0)
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), env=env)
    assert "'ema_alpha' must be in" in log


def test_unknown_faser_config_key(tiny_models, tmp_path):
    env = write_faser_config(tmp_path / "bad.json", polcy="ema")
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), env=env)
    assert "unknown key(s) ['polcy']" in log


def test_missing_faser_config_file(tiny_models, tmp_path):
    env = {"FASER_CONFIG": str(tmp_path / "nope.toml")}
    log = _refused(tiny_models.target, *_faser(tiny_models.draft), env=env)
    assert "does not name a file" in log


def test_draft_with_different_vocabulary(tiny_models, tmp_path):
    model = LlamaForCausalLM.from_pretrained(str(tiny_models.draft), dtype=torch.float32)
    model.resize_token_embeddings(model.config.vocab_size + 64)
    model.save_pretrained(str(tmp_path / "wide"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "wide" / name).write_bytes((tiny_models.draft / name).read_bytes())
    log = _refused(tiny_models.target, *_faser(tmp_path / "wide"))
    assert "FASER needs a draft with the target's vocabulary" in log
