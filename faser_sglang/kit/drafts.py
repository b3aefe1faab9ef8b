"""Derive target and draft checkpoints from a Llama checkpoint, offline.

Speculative decoding is measured on a (target, draft) pair whose acceptance
behaviour and whose compute cost both have to be realistic. These builders
turn one small real model into such pairs without downloading anything:

* :func:`truncate_layers` keeps the first layers: a cheap, weaker draft.
* :func:`widen` grows hidden size, heads, MLP width and depth while keeping
  the logits exactly equal, so a 135M model can cost like a 7B one.
* :func:`perturb` adds relative Gaussian noise: a draft that agrees with its
  target often but not always.
* :func:`distill` trains a draft towards a target's next-token distributions;
  :func:`agreement` measures how often a draft's argmax matches the target's on
  the target's continuations of any prompts.

Every builder writes a plain HuggingFace Llama directory (safetensors shards,
``config.json``, the source's tokenizer files) that SGLang loads like any
checkpoint, plus ``kit.json`` recording the recipe that produced it. A
builder returns at once when its output directory already holds the result
of the same recipe: building a 7B-class target takes minutes, and pipelines
are re-run after fixing a later step.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from faser_sglang.kit.presets import WideShape
from faser_sglang.kit.tiny import CORPUS_MODULES

RECIPE_FILE = "kit.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
MAX_SHARD_BYTES = 4 << 30

Recipe = dict[str, Any]


# --------------------------------------------------------------------------
# Checkpoint files
# --------------------------------------------------------------------------


def read_manifest(model_dir: str | Path) -> dict[str, Any] | None:
    """Return the ``kit.json`` of a kit-built model directory, or None."""
    path = Path(model_dir) / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def is_built(model_dir: str | Path, recipe: Recipe) -> bool:
    """True when ``model_dir`` was completely written by exactly ``recipe``.

    ``kit.json`` is written last, so its presence also means no write was cut
    short.
    """
    manifest = read_manifest(model_dir)
    return manifest is not None and manifest["recipe"] == _jsonable(recipe)


def source_recipe(model_dir: str | Path) -> Recipe:
    """Identify a source checkpoint for a derived recipe.

    A kit-built source is identified by its own recipe, so a derived recipe
    describes the whole chain and a cached result is reused only if every
    step matches. Any other checkpoint is identified by its path and its
    weight files' sizes and modification times.
    """
    manifest = read_manifest(model_dir)
    if manifest:
        return manifest["recipe"]
    weights = {
        f.name: [f.stat().st_size, f.stat().st_mtime_ns]
        for f in sorted(Path(model_dir).glob("*.safetensors"))
    }
    return {"path": str(Path(model_dir).resolve()), "weights": weights}


def load_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of the safetensors shards in ``model_dir``."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    return tensors


def save_checkpoint(
    out_dir: str | Path,
    config: LlamaConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    dtype: torch.dtype,
    recipe: Recipe,
    tokenizer_dir: str | Path,
    metrics: dict[str, Any] | None = None,
) -> Path:
    """Write a Llama checkpoint directory that HF and SGLang load directly.

    ``tensors`` is consumed lazily and written in shards of at most
    ``MAX_SHARD_BYTES``, so a 7B-class model is never fully in memory. A tied
    ``lm_head.weight`` is dropped, as ``save_pretrained`` does. Tokenizer and
    generation-config files are copied from ``tokenizer_dir``; ``kit.json``
    comes last.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECIPE_FILE).unlink(missing_ok=True)
    for stale in [*out.glob("*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)

    writer = _ShardWriter(out)
    for name, tensor in tensors:
        if not (config.tie_word_embeddings and name == "lm_head.weight"):
            writer.add(name, tensor.detach().to("cpu", dtype).contiguous())
    writer.finish()

    config.architectures = ["LlamaForCausalLM"]
    config.dtype = dtype
    config.save_pretrained(str(out))
    copy_tokenizer_files(tokenizer_dir, out)
    manifest = {"recipe": _jsonable(recipe), "metrics": metrics or {}}
    (out / RECIPE_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


class _ShardWriter:
    """Writes tensors into safetensors shards of at most ``MAX_SHARD_BYTES``.

    Shards get their final ``model-XXXXX-of-YYYYY`` names (plus the index
    file) only once the count is known; a single shard is ``model.safetensors``.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.current: dict[str, torch.Tensor] = {}
        self.current_bytes = 0
        self.shards: list[list[str]] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.current and self.current_bytes + nbytes > MAX_SHARD_BYTES:
            self._flush()
        self.current[name] = tensor
        self.current_bytes += nbytes

    def _flush(self) -> None:
        save_file(self.current, str(self._temp_name(len(self.shards))), metadata={"format": "pt"})
        self.shards.append(list(self.current))
        self.current, self.current_bytes = {}, 0

    def _temp_name(self, index: int) -> Path:
        return self.out / f"shard-{index:05d}.safetensors"

    def finish(self) -> None:
        self._flush()
        if len(self.shards) == 1:
            self._temp_name(0).rename(self.out / "model.safetensors")
            return
        weight_map = {}
        for index, names in enumerate(self.shards):
            final = f"model-{index + 1:05d}-of-{len(self.shards):05d}.safetensors"
            self._temp_name(index).rename(self.out / final)
            weight_map.update(dict.fromkeys(names, final))
        index_json = {"metadata": {}, "weight_map": weight_map}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))


def copy_tokenizer_files(src_dir: str | Path, out_dir: str | Path) -> None:
    """Copy tokenizer and generation-config files, so EOS and chat template travel along."""
    src, out = Path(src_dir), Path(out_dir)
    if src.resolve() == out.resolve():
        return
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)


def _jsonable(value: Any) -> Any:
    """Normalise a recipe (dtypes, paths, tuples) to what survives a JSON round trip."""
    return json.loads(json.dumps(value, default=str))


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, the spelling configs and recipes use."""
    return str(dtype).removeprefix("torch.")


def stored_dtype(model_dir: str | Path) -> torch.dtype:
    """dtype of the weights as stored in ``model_dir`` (read from one tensor)."""
    file = min(Path(model_dir).glob("*.safetensors"))
    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(next(iter(handle.keys()))).dtype


def count_parameters(config: LlamaConfig) -> int:
    """Parameter count of a bias-free Llama with this config (tied head counted once)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_dim = config.num_attention_heads * head_dim
    kv_dim = config.num_key_value_heads * head_dim
    per_layer = hidden * (2 * q_dim + 2 * kv_dim) + 3 * hidden * inter + 2 * hidden
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_hidden_layers * per_layer + embeddings + hidden


# --------------------------------------------------------------------------
# Truncation and perturbation
# --------------------------------------------------------------------------


def truncate_layers(src_dir: str | Path, out_dir: str | Path, num_layers: int) -> Path:
    """Keep the first ``num_layers`` decoder layers, the final norm and the head.

    Weights are copied unchanged (same dtype); a truncated model is the
    classic "early exit" draft: cheap, and agreeing with its source on the
    easy tokens only.
    """
    recipe = {"op": "truncate", "num_layers": num_layers, "source": source_recipe(src_dir)}
    if is_built(out_dir, recipe):
        return Path(out_dir)
    config = LlamaConfig.from_pretrained(str(src_dir))
    if not 1 <= num_layers <= config.num_hidden_layers:
        raise ValueError(f"num_layers must be in [1, {config.num_hidden_layers}], got {num_layers}")
    tensors = load_tensors(src_dir)
    kept = {
        name: t
        for name, t in tensors.items()
        if _layer_index(name) is None or _layer_index(name) < num_layers
    }
    config.num_hidden_layers = num_layers
    return save_checkpoint(
        out_dir, config, kept.items(), dtype=stored_dtype(src_dir), recipe=recipe, tokenizer_dir=src_dir
    )


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else None


def perturb(src_dir: str | Path, out_dir: str | Path, noise: float, seed: int = 0) -> Path:
    """Add Gaussian noise of ``noise`` x each tensor's standard deviation.

    Tensors with no spread (e.g. all-ones norms) stay unchanged. On a widened
    model this also disturbs the exact zeros that make it equivalent to its
    source, so perturb before widening when that equivalence matters.
    """
    recipe = {"op": "perturb", "noise": noise, "seed": seed, "source": source_recipe(src_dir)}
    if is_built(out_dir, recipe):
        return Path(out_dir)
    tensors = load_tensors(src_dir)
    gen = torch.Generator().manual_seed(seed)

    def noisy() -> Iterator[tuple[str, torch.Tensor]]:
        for name in sorted(tensors):
            weight = tensors[name].float()
            std = weight.std() if weight.numel() > 1 else torch.tensor(0.0)
            yield name, weight + torch.randn(weight.shape, generator=gen) * std * noise

    config = LlamaConfig.from_pretrained(str(src_dir))
    return save_checkpoint(
        out_dir, config, noisy(), dtype=stored_dtype(src_dir), recipe=recipe, tokenizer_dir=src_dir
    )


# --------------------------------------------------------------------------
# Widening
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions that widening changes."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: LlamaConfig) -> LlamaShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
        )


def q_head_slots(src: LlamaShape, dst: LlamaShape) -> list[int]:
    """Wide q-head index for each source q head.

    Source q head ``h`` attends with kv head ``h // src_group``; placing it at
    ``(h // src_group) * dst_group + h % src_group`` makes it read the same kv
    head (kept at the same index) under the wide grouping.
    """
    src_group, dst_group = src.heads // src.kv_heads, dst.heads // dst.kv_heads
    return [(h // src_group) * dst_group + h % src_group for h in range(src.heads)]


def check_widening(src: LlamaShape, dst: LlamaShape) -> None:
    """Raise ValueError unless ``src`` embeds exactly into ``dst``."""
    problems = []
    if dst.hidden < src.hidden or dst.intermediate < src.intermediate:
        problems.append("hidden and intermediate sizes cannot shrink")
    if dst.heads % dst.kv_heads:
        problems.append(f"num_heads {dst.heads} is not a multiple of num_kv_heads {dst.kv_heads}")
    elif dst.kv_heads < src.kv_heads or dst.heads // dst.kv_heads < src.heads // src.kv_heads:
        problems.append(
            f"need num_kv_heads >= {src.kv_heads} and num_heads/num_kv_heads >= "
            f"{src.heads // src.kv_heads} so every source q head keeps its kv head"
        )
    if problems:
        raise ValueError(f"cannot widen {src} to {dst}: " + "; ".join(problems))


def widen(
    src_dir: str | Path,
    out_dir: str | Path,
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    ballast_layers: int = 0,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Embed a Llama into a wider (and optionally deeper) one with identical logits.

    The source lives in the first ``H0`` residual dims, the first ``I0`` MLP
    units and its own q/kv heads (head_dim is kept, so RoPE is unchanged).
    Everything that writes into the residual stream from new capacity is zero
    (extra ``o_proj``/``down_proj`` rows and columns, extra embedding dims), so
    the extra residual dims stay exactly zero. RMSNorm then averages over
    ``H`` dims of which only ``H0`` are nonzero: ``rms_wide = rms * sqrt(H0/H)``,
    so norm weights are scaled by ``sqrt(H0/H)`` and ``eps`` by ``H0/H``,
    leaving the normalised real dims unchanged.

    ``ballast_layers`` identity layers (random q/k/v/gate/up, zero
    ``o_proj``/``down_proj``) are appended: real attention, MLP and KV-cache
    cost, no effect on the residual stream.

    Weights that only ever multiply zeros are random (seeded, with the std of
    the source tensor they extend) rather than zero: kernels can run a few
    percent faster on zeros, which would make the model cheaper than the
    real model it stands in for.
    """
    config = LlamaConfig.from_pretrained(str(src_dir))
    if config.attention_bias or config.mlp_bias:
        raise ValueError("widening supports bias-free Llama checkpoints only")
    src = LlamaShape.of(config)
    dst = LlamaShape(hidden_size, intermediate_size, num_heads, num_kv_heads, src.head_dim)
    check_widening(src, dst)
    recipe = {
        "op": "widen",
        "shape": asdict(dst),
        "ballast_layers": ballast_layers,
        "seed": seed,
        "dtype": dtype_name(dtype),
        "source": source_recipe(src_dir),
    }
    if is_built(out_dir, recipe):
        return Path(out_dir)
    tensors = load_tensors(src_dir)
    widener = _Widener(src, dst, torch.Generator().manual_seed(seed))

    # Captured now: the generator runs after ``config`` is rewritten below.
    num_layers, tied = config.num_hidden_layers, config.tie_word_embeddings
    last = {
        name.removeprefix(f"model.layers.{num_layers - 1}."): t.float().std().item()
        for name, t in tensors.items()
        if _layer_index(name) == num_layers - 1
    }

    def wide_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        yield "model.embed_tokens.weight", widener.embedding(tensors["model.embed_tokens.weight"])
        for layer in range(num_layers):
            prefix = f"model.layers.{layer}."
            source = {name.removeprefix(prefix): t for name, t in tensors.items() if name.startswith(prefix)}
            yield from ((prefix + name, t) for name, t in widener.layer(source).items())
        for extra in range(num_layers, num_layers + ballast_layers):
            yield from (
                (f"model.layers.{extra}.{name}", t) for name, t in widener.ballast_layer(last).items()
            )
        yield "model.norm.weight", widener.norm(tensors["model.norm.weight"])
        if not tied:
            yield "lm_head.weight", widener.head(tensors["lm_head.weight"])

    config.hidden_size = hidden_size
    config.intermediate_size = intermediate_size
    config.num_attention_heads = num_heads
    config.num_key_value_heads = num_kv_heads
    config.head_dim = src.head_dim
    config.num_hidden_layers += ballast_layers
    config.rms_norm_eps = config.rms_norm_eps * src.hidden / hidden_size
    return save_checkpoint(out_dir, config, wide_tensors(), dtype=dtype, recipe=recipe, tokenizer_dir=src_dir)


def shape_twins(
    src_dir: str | Path,
    out_dir: str | Path,
    target: WideShape,
    draft: WideShape,
    depths: tuple[int, int] | None = None,
) -> dict[str, Path]:
    """``src_dir`` (a tiny model) widened to a pair's target and draft widths: OUT/target
    and OUT/draft have the pair's attention, norm and GEMM shapes.

    Without ``depths`` they keep the tiny model's few layers, so a server started on
    them compiles the pair's kernels and its forwards cost the GPU little. With
    ``depths`` (the pair's (target, draft) layer counts) ballast layers make up the
    pair's depth, so a forward costs what the pair's does, while both twins still
    compute the tiny model's logits: a draft whose every token the target accepts.
    A twin already built is kept (``widen`` checks its recipe)."""
    src_layers = LlamaConfig.from_pretrained(str(src_dir)).num_hidden_layers
    roles = (("target", target), ("draft", draft))
    ballast = [0, 0] if depths is None else [depth - src_layers for depth in depths]
    if min(ballast) < 0:
        raise ValueError(f"the source has {src_layers} layers, more than the pair's {depths}")
    return {
        role: widen(src_dir, Path(out_dir) / role, **{**asdict(shape), "ballast_layers": extra})
        for (role, shape), extra in zip(roles, ballast)
    }


class _Widener:
    """Builds each wide tensor from its source tensor (float32 math)."""

    def __init__(self, src: LlamaShape, dst: LlamaShape, gen: torch.Generator) -> None:
        self.src, self.dst, self.gen = src, dst, gen
        self.slots = q_head_slots(src, dst)
        self.norm_scale = math.sqrt(src.hidden / dst.hidden)

    def random(self, *shape: int, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen) * std

    def embedding(self, weight: torch.Tensor) -> torch.Tensor:
        # Extra dims must be exactly zero: they are the extra residual dims.
        wide = torch.zeros(weight.shape[0], self.dst.hidden)
        wide[:, : self.src.hidden] = weight.float()
        return wide

    def head(self, weight: torch.Tensor) -> torch.Tensor:
        wide = self.random(weight.shape[0], self.dst.hidden, std=weight.float().std().item())
        wide[:, : self.src.hidden] = weight.float()
        return wide

    def norm(self, weight: torch.Tensor) -> torch.Tensor:
        # Extra entries scale residual dims that are zero; any value works.
        wide = torch.full((self.dst.hidden,), self.norm_scale)
        wide[: self.src.hidden] = weight.float() * self.norm_scale
        return wide

    def layer(self, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        src, dst, d = self.src, self.dst, self.src.head_dim
        std = {name: t.float().std().item() for name, t in source.items()}
        # Start from an identity layer (random readers, zero writers) and
        # write the source blocks into it.
        out = self.ballast_layer(std)

        q = out["self_attn.q_proj.weight"].view(dst.heads, d, dst.hidden)
        q[self.slots, :, : src.hidden] = (
            source["self_attn.q_proj.weight"].float().view(src.heads, d, src.hidden)
        )
        for name in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            kv = out[name].view(dst.kv_heads, d, dst.hidden)
            kv[: src.kv_heads, :, : src.hidden] = source[name].float().view(src.kv_heads, d, src.hidden)
        o = out["self_attn.o_proj.weight"].view(dst.hidden, dst.heads, d)
        o[: src.hidden, self.slots, :] = (
            source["self_attn.o_proj.weight"].float().view(src.hidden, src.heads, d)
        )

        for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            out[name][: src.intermediate, : src.hidden] = source[name].float()
        out["mlp.down_proj.weight"][: src.hidden, : src.intermediate] = source["mlp.down_proj.weight"].float()
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[name] = self.norm(source[name])
        return out

    def ballast_layer(self, std: dict[str, float]) -> dict[str, torch.Tensor]:
        """An identity layer: random readers (std per source tensor), zero writers."""
        dst, d = self.dst, self.src.head_dim
        reader_rows = {
            "self_attn.q_proj.weight": dst.heads * d,
            "self_attn.k_proj.weight": dst.kv_heads * d,
            "self_attn.v_proj.weight": dst.kv_heads * d,
            "mlp.gate_proj.weight": dst.intermediate,
            "mlp.up_proj.weight": dst.intermediate,
        }
        layer = {name: self.random(rows, dst.hidden, std=std[name]) for name, rows in reader_rows.items()}
        layer["self_attn.o_proj.weight"] = torch.zeros(dst.hidden, dst.heads * d)
        layer["mlp.down_proj.weight"] = torch.zeros(dst.hidden, dst.intermediate)
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            layer[name] = torch.full((dst.hidden,), self.norm_scale)
        return layer


# --------------------------------------------------------------------------
# Distillation
# --------------------------------------------------------------------------

# Chat-formatted requests mixed into the default prompts, so a distilled draft
# also sees the assistant-turn distribution that chat serving produces.
CHAT_REQUESTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash table is in two sentences.",
    "Write a bash command that counts the lines in every .py file.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that returns the ten most recent orders.",
    "Summarise the plot of Romeo and Juliet.",
    "Give three tips for writing clear commit messages.",
    "Write a JavaScript function that debounces another function.",
    "How do I reverse a linked list?",
    "Write a haiku about autumn.",
    "Explain recursion to a beginner.",
    "Write a Python class for a bank account with deposit and withdraw.",
    "What causes the seasons on Earth?",
    "Convert 100 degrees Fahrenheit to Celsius and show the steps.",
    "Write a regular expression that matches an email address.",
    "List the planets of the solar system in order.",
)


def default_prompts(tokenizer: PreTrainedTokenizerBase, num_code: int = 240, seed: int = 0) -> list[str]:
    """Deterministic offline prompts: stdlib source snippets plus chat requests.

    Code snippets are 4-12 consecutive lines from the fixed stdlib modules of
    :mod:`faser_sglang.kit.tiny`, at seeded offsets. Every other one opens at a
    ``def`` line, so a function's signature and docstring lead its continuation, as
    in a code-completion request (HumanEval's prompts are such headers). The chat
    requests are rendered with the tokenizer's chat template when it has one.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines = [
        line
        for name in CORPUS_MODULES
        for line in (stdlib / name).read_text(encoding="utf-8").splitlines(True)
    ]
    defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
    rng = random.Random(seed)
    prompts = []
    for n in range(num_code):
        length = rng.randint(4, 12)
        start = min(rng.choice(defs), len(lines) - length) if n % 2 else rng.randrange(len(lines) - length)
        prompts.append("".join(lines[start : start + length]))
    if tokenizer.chat_template:
        prompts += [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r}], tokenize=False, add_generation_prompt=True
            )
            for r in CHAT_REQUESTS
        ]
    return prompts


# Default prompts per generate() call. Generation is bound by one forward per new token,
# so on a GPU a wide batch (prompts of similar length side by side) costs about what a
# narrow one does; on a CPU a narrow one wastes less on rows past their own length.
GENERATE_BATCH = 64
# Positions per bucket of ``DistillResult.agreement_by_position``.
POSITION_BUCKET = 128


@dataclass(frozen=True)
class DistillResult:
    """Top-1 agreement (draft argmax == target argmax) on held-out continuations;
    ``agreement_by_position`` splits the trained draft's by sequence position
    ("0-127", "128-255", ...), to show whether it holds as far as a server feeds it."""

    agreement_before: float
    agreement_after: float
    final_loss: float
    held_out_positions: int
    out_dir: str
    agreement_by_position: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sequences:
    tokens: torch.Tensor  # [n, seq_len] prompt + target greedy continuation
    continuation: torch.Tensor  # [n, seq_len] bool: position predicts a target-generated token


def distill(
    target_dir: str | Path,
    draft_dir: str | Path,
    out_dir: str | Path,
    *,
    steps: int = 300,
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 3e-4,
    seed: int = 0,
    device: str | None = None,
    prompts: Sequence[str] | None = None,
    generate_batch: int = GENERATE_BATCH,
) -> DistillResult:
    """Train a draft towards a target by KL on the target's own continuations.

    The target greedily continues each prompt to ``seq_len`` tokens, through any
    end-of-sequence token (:func:`_generate`); the draft is then trained
    to minimise KL(target || draft) of the next-token distributions at every
    position. Each prompt keeps at most its last ``seq_len // 2`` tokens, so the
    continuations cover positions up to ``seq_len``: a draft trained only on short
    sequences loses agreement at the positions a server later feeds it. One prompt
    in eight is held out; top-1 agreement on the held-out
    sequences' generated positions is reported before and after training.

    ``device`` defaults to CUDA when available. On CUDA the target runs in
    bfloat16 and the draft trains in float32 under bfloat16 autocast; on CPU
    everything is float32. The draft is saved in its original dtype.
    """
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    prompts = list(prompts) if prompts is not None else default_prompts(tokenizer, seed=seed)
    if len(prompts) < 2:
        raise ValueError("distill needs at least two prompts (one is held out)")
    recipe = {
        "op": "distill",
        "steps": steps,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "generate_batch": generate_batch,
        "continuations": "through_eos",  # earlier builds suppressed the end token
        "lr": lr,
        "seed": seed,
        "prompts_sha256": hashlib.sha256("\0".join(prompts).encode()).hexdigest(),
        "target": source_recipe(target_dir),
        "source": source_recipe(draft_dir),
    }
    if is_built(out_dir, recipe):
        return DistillResult(**read_manifest(out_dir)["metrics"])

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    target, autocast = _load_target(target_dir, device)
    draft = _load_draft(draft_dir, target)

    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    num_held_out = max(1, len(prompts) // 8)
    held_out = _generate(target, tokenizer, [prompts[i] for i in order[:num_held_out]], seq_len, generate_batch)
    train = _generate(target, tokenizer, [prompts[i] for i in order[num_held_out:]], seq_len, generate_batch)

    before = _agreement(target, draft, held_out, batch_size, autocast).overall()
    final_loss = _train(target, draft, train.tokens, steps, batch_size, lr, seed, autocast)
    after = _agreement(target, draft, held_out, batch_size, autocast)

    result = DistillResult(
        before,
        after.overall(),
        final_loss,
        int(held_out.continuation.sum()),
        str(out_dir),
        after.by_position(),
    )
    save_checkpoint(
        out_dir,
        draft.config,
        draft.state_dict().items(),
        dtype=stored_dtype(draft_dir),
        recipe=recipe,
        tokenizer_dir=draft_dir,
        metrics=asdict(result),
    )
    return result


def agreement(
    target_dir: str | Path,
    drafts: Mapping[str, str | Path],
    prompts: Sequence[str],
    *,
    seq_len: int,
    batch_size: int = 8,
    generate_batch: int = GENERATE_BATCH,
    device: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Top-1 agreement of each draft with the target on the target's greedy
    continuations of ``prompts`` (each prompt's last ``seq_len // 2`` tokens, continued
    to ``seq_len`` through end tokens): {name: {"all": fraction, "by_position": {...}}}.

    Evaluated on a workload's prompts, it is what that workload's served acceptance of a
    first draft comes near (the draft and target run as in :func:`distill`).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target, autocast = _load_target(target_dir, device)
    data = _generate(target, tokenizer, prompts, seq_len, generate_batch)
    out = {}
    for name, draft_dir in drafts.items():
        found = _agreement(target, _load_draft(draft_dir, target), data, batch_size, autocast)
        out[name] = {"all": found.overall(), "by_position": found.by_position()}
    return out


def _load_target(target_dir: str | Path, device: str) -> tuple[LlamaForCausalLM, torch.autocast]:
    """The target for inference (bfloat16 on CUDA, float32 elsewhere) and the autocast
    the draft runs under beside it."""
    on_cuda = device.startswith("cuda")
    target = LlamaForCausalLM.from_pretrained(
        str(target_dir), dtype=torch.bfloat16 if on_cuda else torch.float32
    ).to(device)
    target.eval()
    return target, torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_cuda)


def _load_draft(draft_dir: str | Path, target: LlamaForCausalLM) -> LlamaForCausalLM:
    """A float32 draft on the target's device (trained under bfloat16 autocast on CUDA)."""
    draft = LlamaForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).to(target.device)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError("draft and target vocabularies differ")
    return draft


def _train(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    tokens: torch.Tensor,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    autocast: torch.autocast,
) -> float:
    """Minimise KL(target || draft) over random batches of ``tokens``; return the last loss."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(steps))
    gen = torch.Generator().manual_seed(seed)
    draft.train()
    loss_value = float("nan")
    progress = tqdm(range(steps), desc="distill", unit="step")
    for _ in progress:
        batch = tokens[torch.randint(len(tokens), (batch_size,), generator=gen)].to(target.device)
        with torch.no_grad(), autocast:
            target_logp = F.log_softmax(target(batch).logits.float(), dim=-1)
        with autocast:
            draft_logp = F.log_softmax(draft(batch).logits.float(), dim=-1)
        loss = F.kl_div(
            draft_logp.flatten(0, 1), target_logp.flatten(0, 1), log_target=True, reduction="batchmean"
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        progress.set_postfix(kl=f"{loss_value:.4f}")
    draft.eval()
    return loss_value


def _warmup_cosine(steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup over 5% of the steps, then cosine decay to 10%."""
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    return factor


@torch.no_grad()
def _generate(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    seq_len: int,
    batch: int,
) -> _Sequences:
    """Greedy target continuations, each cut to exactly ``seq_len`` tokens; ``batch``
    prompts per generate() call.

    The continuations run past an end-of-sequence token, as a server's do under
    ``ignore_eos`` (SGLang keeps generating after it; it does not mask it): a small
    model often ends a completion early and then writes an unrelated turn, and a
    draft that never saw a context past an end token mispredicts all of it.
    """
    # Cleared on the model's own config: generate() reads a None it is passed, in its
    # arguments or in a config of its own, as "the model's default".
    eos_token_id = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        return _greedy_continuations(model, tokenizer, prompts, seq_len, batch)
    finally:
        model.generation_config.eos_token_id = eos_token_id


def _greedy_continuations(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    seq_len: int,
    batch: int,
) -> _Sequences:
    encoded = []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        if not ids:
            raise ValueError(f"prompt {prompt!r} encodes to no tokens")
        # Keep the end of a long prompt: it is what the continuation depends on.
        encoded.append(ids[-(seq_len // 2) :])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = torch.empty(len(encoded), seq_len, dtype=torch.long)
    continuation = torch.zeros(len(encoded), seq_len, dtype=torch.bool)
    device = model.device
    # Similar lengths share a batch, so few rows generate past their own seq_len.
    by_length = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    for start in tqdm(range(0, len(encoded), batch), desc="target continuations", unit="batch"):
        rows = by_length[start : start + batch]
        chunk = [encoded[i] for i in rows]
        width = max(map(len, chunk))
        # Left padding keeps every prompt's last token at the generation front.
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
        new_tokens = seq_len - min(map(len, chunk))
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        if out.shape[1] < width + new_tokens:
            raise RuntimeError(f"generate() stopped after {out.shape[1] - width} of {new_tokens} new tokens")
        for j, (i, ids) in enumerate(zip(rows, chunk)):
            offset = width - len(ids)
            tokens[i] = out[j, offset : offset + seq_len].cpu()
            continuation[i, len(ids) - 1 : seq_len - 1] = True
    return _Sequences(tokens, continuation)


@dataclass(frozen=True)
class _Agreement:
    agree: torch.Tensor  # [seq_len] int64: continuation positions where the argmaxes agree
    total: torch.Tensor  # [seq_len] int64: continuation positions

    def overall(self) -> float:
        return int(self.agree.sum()) / int(self.total.sum())

    def by_position(self) -> dict[str, float]:
        """Agreement per POSITION_BUCKET positions, buckets without continuation left out."""
        out = {}
        for lo in range(0, len(self.total), POSITION_BUCKET):
            total = int(self.total[lo : lo + POSITION_BUCKET].sum())
            if total:
                agree = int(self.agree[lo : lo + POSITION_BUCKET].sum())
                out[f"{lo}-{lo + POSITION_BUCKET - 1}"] = agree / total
        return out


@torch.no_grad()
def _agreement(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    data: _Sequences,
    batch_size: int,
    autocast: torch.autocast,
) -> _Agreement:
    """Where draft and target argmax agree on the continuation positions, per position."""
    agree = torch.zeros(data.tokens.shape[1], dtype=torch.int64)
    total = torch.zeros(data.tokens.shape[1], dtype=torch.int64)
    for start in range(0, len(data.tokens), batch_size):
        tokens = data.tokens[start : start + batch_size].to(target.device)
        mask = data.continuation[start : start + batch_size].to(target.device)
        with autocast:
            same = target(tokens).logits.argmax(-1) == draft(tokens).logits.argmax(-1)
        agree += (same & mask).sum(0).cpu()
        total += mask.sum(0).cpu()
    return _Agreement(agree, total)
