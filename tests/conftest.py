"""Shared fixtures: tiny models built once per test session (seconds, no downloads)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from faser_sglang.kit.tiny import build_identity_transition_model, build_tiny_llama
from faser_sglang.spec_worker.adaptive import CostModel, DraftCost, PlainCost, VerifyCost
from server_utils import CPU_SERVER_ENV, generate, generate_each


def profiled_costs(
    *, extend: float, decode: float, catchup_token: float, verify: float, verify_token: float,
    plain: float, plain_row: float,
) -> CostModel:  # fmt: skip
    """A profiled cost model with the terms the H200 profiles fit (seconds); the others 0."""
    return CostModel(
        draft=DraftCost(extend, decode, row_step=0.0, catchup_token=catchup_token, context_row_step=0.0),
        verify=VerifyCost(verify, row=0.0, token=verify_token, context_token=0.0),
        source="profiled",
        plain=PlainCost(plain, row=plain_row, context_token=0.0),
    )


# The cost-faithful pairs on an H200, rounded. 7.18B / 0.42B (results/gpu/2026-12-01-ab/
# costs.json): drafting rarely pays there, so the allocator's bound ends most steps.
H200_7B = profiled_costs(extend=2.26e-3, decode=1.32e-3, catchup_token=1.52e-5, verify=6.93e-3,
                         verify_token=1.85e-5, plain=5.65e-3, plain_row=2.13e-5)  # fmt: skip
# 13.5B / 0.42B (results/gpu/2026-12-01-14b-ab/costs.json).
H200_14B = profiled_costs(extend=2.36e-3, decode=1.35e-3, catchup_token=26e-6, verify=11.5e-3,
                          verify_token=34e-6, plain=9.9e-3, plain_row=29e-6)  # fmt: skip


# Mixed lengths: a few tokens up to a few hundred, so verify chunks sit on prefixes
# of very different sizes in one batch.
PROMPTS = [
    "def foo(x):",
    "import os\n",
    "hello",
    "class A:\n    def __init__(self, value):\n        self.value = value\n",
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n" * 6,
    "print(",
    "while True:\n    ",
    "# A long comment about argument parsing and help text\n" * 12,
    "return",
    "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n",
]


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


def catchup_gaps(steps: list[dict]) -> list[int]:
    """Committed tokens the draft had not seen, per drafting request-step of a trace."""
    return [n - d for s in steps for n, d, k in zip(s["seq_lens"], s["draft_kv_lens"], s["draft_lens"]) if k > 0]


def load_script(name: str):
    """scripts/<name>.py as a module (registered in sys.modules: its dataclasses look
    their module up there)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Sampling parameters that exercise every transform a sampled draft chain applies.
SAMPLED_MIX = (
    {"temperature": 0.8, "top_k": 8},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0},
    {"temperature": 1.2, "min_p": 0.05},
)


def sampled_mix_with_bias(greedy_outputs: list[list[int]]) -> tuple[dict, ...]:
    """SAMPLED_MIX plus a greedy and a sampled request with a logit bias that matters:
    it bans the two tokens ``greedy_outputs`` emit most and favours the third."""
    top = [t for t, _ in Counter(t for out in greedy_outputs for t in out).most_common(3)]
    bias = {str(top[0]): -100.0, str(top[1]): -100.0, str(top[2]): 3.0}
    return (*SAMPLED_MIX, {"temperature": 0, "logit_bias": bias}, {"temperature": 0.9, "logit_bias": bias})


def ids(outputs: list[dict]) -> list[list[int]]:
    """The output token ids of /generate responses."""
    return [o["output_ids"] for o in outputs]


def generate_sampled_mix(base_url: str, max_new_tokens: int = 40) -> list[dict]:
    """Every prompt of PROMPTS as a request of its own, all at once, with the parameters
    of ``sampled_mix_with_bias`` in turn (its bias from 16 greedy tokens of each prompt),
    ignoring EOS: sampling, greedy and logit-biased requests in one batch."""
    greedy = generate(base_url, PROMPTS, {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
    mix = sampled_mix_with_bias(ids(greedy))
    params = [{**mix[i % len(mix)], "max_new_tokens": max_new_tokens, "ignore_eos": True} for i in range(len(PROMPTS))]
    return generate_each(base_url, PROMPTS, params)


def multinomial_chisquare_pvalue(observed: np.ndarray, probs: np.ndarray, draws: int = 20_000) -> float:
    """P-value of Pearson's statistic for ``observed`` counts [cells] under a multinomial
    with cell ``probs`` [cells]. A few hundred tokens over a marginal several tokens deep
    leave a long tail of cells expected far below once each, where one token in a cell
    expected 0.001 times adds 1000 to the statistic: the tail is pooled into one cell
    (each cell kept on its own is expected >= 5 times), and the p-value comes from
    ``draws`` seeded multinomial samples rather than the chi-square law."""
    n = int(observed.sum())
    tail = probs * n < 5
    if tail.any():
        observed = np.append(observed[~tail], observed[tail].sum())
        probs = np.append(probs[~tail], probs[tail].sum())
    expected = probs * n
    stat = float(((observed - expected) ** 2 / expected).sum())
    sims = np.random.default_rng(0).multinomial(n, probs, size=draws)
    exceed = int((((sims - expected) ** 2 / expected).sum(axis=1) >= stat).sum())
    return (1 + exceed) / (1 + draws)


def assert_tokens_follow_target(
    tiny_models: TinyModels,
    base_url: str,
    positions: tuple[int, ...],
    max_new_tokens: Optional[int] = None,
    together: int = 50,
) -> None:
    """Chi-square on each generated token at ``positions`` (0: the prefill's) against
    its exact marginal under the target, summed over every prefix of top-4 tokens
    (transformers), over 400 requests sent ``together`` at a time (400 divisible by it).
    Requests generate ``max_new_tokens`` (default: through the last position); a length
    policy drafts less near a request's end."""
    prompt = "def foo(x):"
    new_tokens = max_new_tokens or max(positions) + 1
    params = {"max_new_tokens": new_tokens, "temperature": 0.9, "top_k": 4, "ignore_eos": True}
    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    model = LlamaForCausalLM.from_pretrained(tiny_models.target, dtype=torch.float32)
    prompt_ids = tok(prompt)["input_ids"]

    def dist(ids_: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids_])).logits[0, -1] / params["temperature"]
        top = torch.topk(logits, params["top_k"])
        p = torch.zeros_like(logits)
        p[top.indices] = torch.softmax(top.values, dim=-1)
        return p

    # marginals[j]: the distribution of generated token j; prefixes: (tokens, probability).
    marginals: list[torch.Tensor] = []
    prefixes = [([], 1.0)]
    for _ in range(max(positions) + 1):
        step = [(ids_, weight, dist(prompt_ids + ids_)) for ids_, weight in prefixes]
        marginals.append(sum(weight * p for _, weight, p in step))
        prefixes = [(ids_ + [t], weight * float(p[t])) for ids_, weight, p in step for t in torch.nonzero(p).flatten().tolist()]

    outputs = []
    for _ in range(400 // together):
        outputs += [o["output_ids"] for o in generate(base_url, [prompt_ids] * together, params)]
    for j in positions:
        samples = [ids_[j] for ids_ in outputs]
        expected = marginals[j]
        support = torch.nonzero(expected > 0).flatten().tolist()
        assert set(samples) <= set(support), f"token {j} outside the target's support"
        counts = Counter(samples)
        observed = np.array([counts.get(t, 0) for t in support])
        probs = expected[support].double().numpy()
        assert multinomial_chisquare_pvalue(observed, probs / probs.sum()) > 1e-3, f"token {j}"
