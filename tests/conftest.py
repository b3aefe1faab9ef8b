"""Shared fixtures: tiny models built once per test session (seconds, no downloads)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from faser_sglang.kit.tiny import build_identity_transition_model, build_tiny_llama
from faser_sglang.spec_worker.adaptive import CostModel, DraftCost, PlainCost, VerifyCost
from server_utils import CPU_SERVER_ENV

# The 13.5B / 0.42B cost-faithful pair on an H200 (2026-12-01 profile), rounded.
H200_14B = CostModel(
    draft=DraftCost(extend_forward=2.36e-3, decode_forward=1.35e-3, row_step=0.0, catchup_token=26e-6,
                    context_row_step=0.0),
    verify=VerifyCost(fixed=11.5e-3, row=0.0, token=34e-6, context_token=0.0),
    source="profiled",
    plain=PlainCost(fixed=9.9e-3, row=29e-6, context_token=0.0),
)  # fmt: skip


@dataclass(frozen=True)
class TinyModels:
    target: Path  # random tiny Llama
    draft: Path  # the target with noisy weights: partial, prompt-dependent acceptance
    identity: Path  # next token depends only on the current token


def build_tiny_models(root: Path, **shape: int) -> TinyModels:
    target = build_tiny_llama(root / "target", seed=1, **shape)
    return TinyModels(
        target=target,
        draft=perturbed_copy(target, root / "draft", 0.05, seed=2),
        identity=build_identity_transition_model(root / "identity", seed=3, **shape),
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    return build_tiny_models(tmp_path_factory.mktemp("models"))


def perturbed_copy(src: Path, dst: Path, noise: float, seed: int) -> Path:
    """Save src with Gaussian noise of ``noise`` x each tensor's std added to every
    weight: a draft that agrees with its target often but not always."""
    model = LlamaForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * noise)
    model.save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dst))
    return dst


@pytest.fixture
def cpu_server_env(monkeypatch) -> None:
    """The environment a CPU SGLang server needs, for tools that launch their own."""
    for k, v in CPU_SERVER_ENV.items():
        monkeypatch.setenv(k, v)


def write_faser_config(path: Path, **fields) -> dict[str, str]:
    """Write a FASER config file and return the env that selects it."""
    path.write_text(json.dumps(fields))
    return {"FASER_CONFIG": str(path)}


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
