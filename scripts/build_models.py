#!/usr/bin/env python3
"""Build offline target/draft checkpoints for FASER experiments.

Subcommands (each output is a HuggingFace Llama directory SGLang loads as is)::

    python scripts/build_models.py tiny OUT [--hidden 256 --intermediate 512]
    python scripts/build_models.py smollm2 OUT [--dtype bfloat16]
    python scripts/build_models.py truncate SRC OUT --layers 8
    python scripts/build_models.py widen SRC OUT --hidden 4096 --intermediate 14336 \\
        --heads 64 --kv-heads 16 --ballast 2
    python scripts/build_models.py twins SRC OUT --preset cost-faithful-14b [--full-depth]
    python scripts/build_models.py perturb SRC OUT --noise 0.05
    python scripts/build_models.py distill TARGET DRAFT OUT --steps 300
    python scripts/build_models.py pair OUT --preset cost-faithful   # or cost-faithful-14b, cpu

``pair`` builds a whole (target, draft) pair from SmolLM2-135M-Instruct, the
one real model available offline (see ``faser_sglang.kit.smollm2``). Every
step is cached in OUT, so an interrupted build resumes where it stopped.
OUT/pair.json names the two model directories and records their parameter
counts and the draft's distillation agreement: on held-out distillation prompts
(overall and by position) and on the HumanEval prompts the A/B serves, before and
after distillation.

Presets (shapes, distillation settings, what each stands in for):
:mod:`faser_sglang.kit.presets`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig

from faser_sglang.bench import workloads
from faser_sglang.kit.drafts import (
    GENERATE_BATCH,
    agreement as draft_agreement,
    count_parameters,
    default_prompts,
    distill,
    perturb,
    shape_twins,
    truncate_layers,
    widen,
)
from faser_sglang.kit.presets import PRESETS, PairPreset, WideShape
from faser_sglang.kit.smollm2 import build_smollm2
from faser_sglang.kit.tiny import build_tiny_llama

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_pair(
    out_dir: Path, preset: PairPreset, *, distill_steps: int | None, device: str | None, widen_models: bool = True
) -> dict:
    """Build the preset's target and draft under ``out_dir``; return the pair summary.
    Without ``widen_models`` the summary names the unwidened models (same logits): the
    draft's agreement, minutes before a wide target would be written.

    The base SmolLM2 and the unwidened drafts stay float32 so that widening
    rounds to the output dtype once. Distillation runs against the unwidened
    SmolLM2: same logits as the widened target, far cheaper.
    """
    base = build_smollm2(out_dir / "smollm2", dtype=torch.float32)
    layers = preset.draft_layers
    draft = truncate_layers(base, out_dir / f"draft-{layers}l", layers)
    settings = preset.distill
    steps = settings.steps if distill_steps is None else distill_steps
    agreement = None
    if steps > 0:
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        result = distill(
            base,
            draft,
            out_dir / f"draft-{layers}l-distilled",
            steps=steps,
            seq_len=settings.seq_len,
            batch_size=settings.batch_size,
            lr=settings.lr,
            device=device,
            prompts=default_prompts(tokenizer, num_code=settings.code_prompts),
            generate_batch=settings.generate_batch,
        )
        agreement = {
            "before": result.agreement_before,
            "after": result.agreement_after,
            "after_by_position": result.agreement_by_position,
            # On the A/B's own prompts, which the distillation never saw: what served
            # acceptance of a first draft comes near.
            "humaneval": draft_agreement(
                base,
                {"before": draft, "after": result.out_dir},
                [r.prompt for r in workloads.humaneval()],
                seq_len=settings.seq_len,
                generate_batch=settings.generate_batch,
                device=device,
            ),
        }
        draft = Path(result.out_dir)

    target = base
    if preset.target and widen_models:
        target = widen(base, out_dir / "target", **asdict(preset.target), dtype=DTYPES[preset.dtype])
    if preset.draft and widen_models:
        draft = widen(draft, out_dir / "draft", **asdict(preset.draft), dtype=DTYPES[preset.dtype])
    summary = {
        "target": str(target),
        "draft": str(draft),
        "target_params": count_parameters(LlamaConfig.from_pretrained(str(target))),
        "draft_params": count_parameters(LlamaConfig.from_pretrained(str(draft))),
        "distill_agreement": agreement,
    }
    (out_dir / "pair.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tiny", help="random tiny Llama (+ locally trained tokenizer), in seconds")
    p.add_argument("out", type=Path)
    p.add_argument("--hidden", type=int, default=256, help="FlashInfer needs head_dim >= 64: 256 / 4 heads")
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)

    p = sub.add_parser("smollm2", help="SmolLM2-135M-Instruct from the packaged GGUF")
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")

    p = sub.add_parser("truncate", help="keep the first N decoder layers")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, required=True)

    p = sub.add_parser("widen", help="wider/deeper model with identical logits")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--intermediate", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--ballast", type=int, default=0, help="identity layers appended")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")

    p = sub.add_parser("twins", help="SRC widened to a preset's target and draft widths, no ballast")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path, help="gets target/ and draft/")
    p.add_argument("--preset", choices=PRESETS, required=True)
    p.add_argument(
        "--full-depth", action="store_true", help="ballast up to the pair's layer counts: its forwards' cost"
    )

    p = sub.add_parser("perturb", help="add relative Gaussian noise to every tensor")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--noise", type=float, required=True, help="noise std as a fraction of each tensor's std")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("distill", help="train a draft on a target's next-token distributions")
    p.add_argument("target", type=Path)
    p.add_argument("draft", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--generate-batch", type=int, default=GENERATE_BATCH, help="prompts per target generate() call")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--prompts", type=Path, help="JSON list of prompt strings (default: built-in set)")

    p = sub.add_parser("pair", help="a whole target/draft pair from SmolLM2")
    p.add_argument("out", type=Path)
    p.add_argument("--preset", choices=PRESETS, required=True)
    p.add_argument(
        "--distill-steps", type=int, default=None, help="override the preset; 0 skips distillation"
    )
    p.add_argument("--device", default=None, help="distillation device (default: cuda when available)")
    p.add_argument(
        "--no-widen", action="store_true", help="stop after the distillation (pair.json names unwidened models)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "tiny":
        print(build_tiny_llama(args.out, seed=args.seed, hidden_size=args.hidden, intermediate_size=args.intermediate))
    elif args.command == "smollm2":
        print(build_smollm2(args.out, DTYPES[args.dtype]))
    elif args.command == "truncate":
        print(truncate_layers(args.src, args.out, args.layers))
    elif args.command == "widen":
        shape = WideShape(args.hidden, args.intermediate, args.heads, args.kv_heads, args.ballast)
        print(widen(args.src, args.out, **asdict(shape), seed=args.seed, dtype=DTYPES[args.dtype]))
    elif args.command == "twins":
        preset = PRESETS[args.preset]
        if preset.target is None or preset.draft is None:
            raise SystemExit(f"preset {args.preset} does not widen its models: no shape twins to build")
        depths = preset.depths() if args.full_depth else None
        twins = shape_twins(args.src, args.out, preset.target, preset.draft, depths)
        print(json.dumps({role: str(path) for role, path in twins.items()}))
    elif args.command == "perturb":
        print(perturb(args.src, args.out, args.noise, args.seed))
    elif args.command == "distill":
        prompts = json.loads(args.prompts.read_text()) if args.prompts else None
        result = distill(
            args.target,
            args.draft,
            args.out,
            steps=args.steps,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            device=args.device,
            prompts=prompts,
            generate_batch=args.generate_batch,
        )
        print(json.dumps(asdict(result), indent=2))
    else:
        summary = build_pair(
            args.out,
            PRESETS[args.preset],
            distill_steps=args.distill_steps,
            device=args.device,
            widen_models=not args.no_widen,
        )
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
