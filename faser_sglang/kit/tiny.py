"""Deterministic tiny random Llama models for tests, built offline.

Tests need real HuggingFace model directories that SGLang can load like any
other checkpoint, but must not download anything and must run on a small CPU.
This module trains a byte-level BPE tokenizer on Python standard-library
source read from the local interpreter's install (a fixed, always-present
corpus) and pairs it with a randomly initialised ``LlamaForCausalLM``.
Everything is seeded, so the same interpreter and seed yield identical files.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS)

DEFAULT_VOCAB_SIZE = 512

# Stdlib modules whose source forms the tokenizer training corpus: plain
# Python files present in every CPython install, read in this fixed order.
CORPUS_MODULES = (
    "textwrap.py",
    "string.py",
    "functools.py",
    "dataclasses.py",
    "enum.py",
    "argparse.py",
    "json/encoder.py",
    "json/decoder.py",
)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus_texts() -> list[str]:
    """Return the tokenizer training corpus: fixed stdlib sources, in order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_MODULES]


def build_tokenizer(
    out_dir: str | Path | None = None, *, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with a chat template and eos token.

    Byte-level BPE can encode any prompt text, so tests are free to use
    arbitrary strings. When ``out_dir`` is given the tokenizer files are saved
    there, ready to sit next to a model's weights.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(), trainer=trainer)

    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        hf_tokenizer.save_pretrained(str(out_dir))
    return hf_tokenizer


def build_tiny_llama(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.2,
) -> Path:
    """Save a random float32 ``LlamaForCausalLM`` plus tokenizer to ``out_dir``.

    ``initializer_range`` defaults well above HF's 0.02 so that logits are
    spread out: greedy decoding then has clear winners, and comparisons
    between two numerically different but equivalent execution paths (e.g.
    plain versus speculative decoding) are not decided by float rounding.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out))
    return out


def build_identity_transition_model(out_dir: str | Path, seed: int = 0, **shape: int) -> Path:
    """Save a tiny Llama whose next token depends only on the current token.

    Every attention ``o_proj`` and MLP ``down_proj`` weight is zeroed, so each
    layer adds exactly nothing to the residual stream: the final hidden state
    is the current token's embedding. Used as its own draft model, a greedy
    speculative decoder must therefore accept every drafted token.
    """
    out = build_tiny_llama(out_dir, seed=seed, **shape)
    model = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(str(out))
    return out
