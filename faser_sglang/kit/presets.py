"""(target, draft) pairs built from SmolLM2 by ``scripts/build_models.py pair``.

Plain data (no torch import), so shell scripts can read a preset's shapes quickly:

    python -m faser_sglang.kit.presets cost-faithful target            # widen flags
    python -m faser_sglang.kit.presets cost-faithful max-total-tokens  # KV tokens to serve with

``cost-faithful`` (run on a GPU machine: the distillation wants CUDA and the
target is 14.4 GB in bfloat16)
    target: SmolLM2 widened to hidden 4096, intermediate 14336, 64 q / 16 kv
    heads of dim 64, 30 real + 2 ballast = 32 layers, tied 49152-token
    vocabulary: 7,180,914,688 parameters. Its linear layers, attention FLOPs
    and KV-cache bytes per token (16 x 64 = 8 x 128 per layer) match
    Mistral-7B's (heads are 64-dim rather than 128-dim, the head has 49152
    rows rather than 32000); its logits are SmolLM2's.
    draft: SmolLM2's first 20 layers, distilled against SmolLM2 (whose logits
    the target reproduces exactly, at 1/50 of the cost) on 512-token sequences
    (the positions a served HumanEval request reaches), widened to hidden
    1024, intermediate 4096, 16 q / 4 kv heads, 20 real + 4 ballast = 24
    layers: 415,286,272 parameters, 5.8% of the target, shaped like
    Qwen2.5-0.5B (24 layers, hidden 896). The real/ballast split sets how
    well the draft predicts the target without changing what it costs; an
    8-layer draft (distilled 500 steps) agreed with the target on 0.62 of
    held-out code tokens and had 1.33 tokens accepted per one-draft step on
    HumanEval: too weak for drafting to pay on any speculative method, which
    says nothing about the methods being compared.

``cost-faithful-14b`` (GPU; the target is 26.9 GB in bfloat16)
    target: SmolLM2 widened to hidden 5120, intermediate 13824, 80 q / 16 kv
    heads of dim 64, 30 real + 18 ballast = 48 layers: 13,464,212,480
    parameters, the linear shapes, layer count and KV bytes per token (16 x
    64 = 8 x 128) of Qwen2.5-14B. draft: the same 0.42B draft, 3.1% of the
    target. On an H200 a 7B-class decode step costs only ~4x a 0.5B draft
    step (both are bound by kernel latency at small batches, not by their
    weights), so drafting barely pays there for any method; against a target
    twice as heavy it does.

``cpu`` (small enough for SGLang on a CPU; float32; the distillation takes
about half an hour on two idle cores)
    target: SmolLM2-135M-Instruct as is: 134,515,008 parameters.
    draft: its first 8 layers, distilled: 56,632,896 parameters.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class WideShape:
    """Shape arguments of :func:`faser_sglang.kit.drafts.widen`."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    ballast_layers: int

    def widen_flags(self) -> str:
        """``build_models.py widen`` flags for this shape (ballast left out: warm-up
        twins need the attention and norm shapes, not the depth)."""
        return (
            f"--hidden {self.hidden_size} --intermediate {self.intermediate_size} "
            f"--heads {self.num_heads} --kv-heads {self.num_kv_heads}"
        )


@dataclass(frozen=True)
class DistillSettings:
    """Arguments of :func:`faser_sglang.kit.drafts.distill`; ``code_prompts`` sizes the
    default prompt set."""

    steps: int
    seq_len: int
    batch_size: int
    lr: float
    code_prompts: int
    generate_batch: int


SMOLLM2_LAYERS = 30  # SmolLM2-135M-Instruct's decoder layers: a widened target's real ones


@dataclass(frozen=True)
class PairPreset:
    """A (target, draft) pair derived from SmolLM2; None shapes mean "not widened"."""

    target: WideShape | None
    draft_layers: int
    draft: WideShape | None
    distill: DistillSettings
    dtype: str  # torch dtype name of the built checkpoints
    # KV-cache tokens to serve the pair with on one H200 at --mem-fraction-static 0.8
    # (target and draft pools; None: no GPU serving preset).
    max_total_tokens: int | None

    def depths(self) -> tuple[int, int]:
        """(target, draft) decoder layers of the built pair, ballast included."""
        target = SMOLLM2_LAYERS + (self.target.ballast_layers if self.target else 0)
        return target, self.draft_layers + (self.draft.ballast_layers if self.draft else 0)


def _gpu_pair(target: WideShape, max_total_tokens: int) -> PairPreset:
    """A widened SmolLM2 target with the 0.42B draft: SmolLM2's first 20 layers widened
    like Qwen2.5-0.5B plus 4 ballast layers, distilled on the GPU, all bfloat16."""
    return PairPreset(
        target=target,
        draft_layers=20,
        draft=WideShape(
            hidden_size=1024, intermediate_size=4096, num_heads=16, num_kv_heads=4, ballast_layers=4
        ),
        # 512 positions: the A/B feeds the draft a HumanEval prompt (mostly under 256
        # tokens) and 256 new tokens; a draft distilled on 128 had seen none past 128.
        # HF generate() on the GPU is bound by host work per new token (2 and 256 prompts
        # both took ~30 s for 450 tokens on an H200 machine), so few wide batches.
        distill=DistillSettings(
            steps=2000, seq_len=512, batch_size=16, lr=3e-4, code_prompts=2048, generate_batch=1024
        ),
        dtype="bfloat16",
        max_total_tokens=max_total_tokens,
    )


PRESETS = {
    # 14.4 GB weights; 128 KiB (target) + 24 KiB (draft) of KV per token.
    "cost-faithful": _gpu_pair(
        WideShape(
            hidden_size=4096, intermediate_size=14336, num_heads=64, num_kv_heads=16, ballast_layers=2
        ),
        max_total_tokens=400_000,
    ),
    # 26.9 GB weights; 192 KiB (target) + 24 KiB (draft) of KV per token.
    "cost-faithful-14b": _gpu_pair(
        WideShape(
            hidden_size=5120, intermediate_size=13824, num_heads=80, num_kv_heads=16, ballast_layers=18
        ),
        max_total_tokens=250_000,
    ),
    "cpu": PairPreset(
        target=None,
        draft_layers=8,
        draft=None,
        distill=DistillSettings(
            steps=300, seq_len=128, batch_size=8, lr=3e-4, code_prompts=240, generate_batch=64
        ),
        dtype="float32",
        max_total_tokens=None,
    ),
}


def main(argv: list[str]) -> int:
    fields = ("target", "draft", "max-total-tokens")
    if len(argv) != 2 or argv[0] not in PRESETS or argv[1] not in fields:
        print(f"usage: python -m faser_sglang.kit.presets {{{','.join(PRESETS)}}} {{{','.join(fields)}}}",
              file=sys.stderr)  # fmt: skip
        return 2
    preset = PRESETS[argv[0]]
    value = preset.max_total_tokens if argv[1] == "max-total-tokens" else getattr(preset, argv[1])
    if value is None:
        print(f"preset {argv[0]} has no {argv[1]}", file=sys.stderr)
        return 1
    print(value if isinstance(value, int) else value.widen_flags())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
