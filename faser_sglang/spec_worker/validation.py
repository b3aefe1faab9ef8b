"""Startup checks: refuse configurations FASER cannot serve, naming the fix.

``validate_server_args`` runs in the launching process while SGLang resolves its
arguments, so a bad flag fails before any model is loaded. The draft/target
vocabulary check needs both models and runs when the worker is built.
"""

from __future__ import annotations

import logging

from faser_sglang.config import FaserConfig

logger = logging.getLogger(__name__)

# Attention backends whose EXTEND and decode-row paths (ragged verify chunks over a
# paged prefix, chunk_forward.py) FASER has been verified on.
SUPPORTED_ATTENTION_BACKENDS = ("flashinfer", "triton", "intel_amx")
MAX_DRAFT_LEN = 32
DEFAULT_DRAFT_LEN = 5


# Draft attention backends whose multi-step plans need no host lengths (draft_ahead.py).
DRAFT_AHEAD_BACKENDS = ("triton", "intel_amx")


def validate_server_args(server_args) -> None:
    """SGLang's per-algorithm validator (raises ValueError naming flag and fix)."""
    config = FaserConfig.from_env()  # a bad FASER config fails here, before model loading
    if not server_args.speculative_draft_model_path:
        raise ValueError(
            "FASER needs a draft model: pass --speculative-draft-model-path PATH "
            "(any causal LM with the target's vocabulary)."
        )
    k = server_args.speculative_num_steps
    if k is not None and not (1 <= int(k) <= MAX_DRAFT_LEN):
        raise ValueError(
            f"--speculative-num-steps is FASER's maximum draft length K_max and must be "
            f"in [1, {MAX_DRAFT_LEN}], got {k}."
        )
    topk = server_args.speculative_eagle_topk
    if topk not in (None, 1):
        raise ValueError(
            f"FASER drafts chains, not trees: --speculative-eagle-topk must be 1 "
            f"(or unset), got {topk}."
        )
    if server_args.enable_deterministic_inference:
        raise ValueError(
            "FASER does not support --enable-deterministic-inference: its draft and verify "
            "forwards are not batch-invariant and its sampling does not use SGLang's "
            "per-request seeds. Remove the flag, or serve without speculation."
        )
    for backend in _attention_backends(server_args):
        if backend not in SUPPORTED_ATTENTION_BACKENDS:
            raise ValueError(
                f"FASER does not support --attention-backend {backend}: its ragged verify "
                f"runs on {SUPPORTED_ATTENTION_BACKENDS}. Pass --attention-backend "
                "flashinfer (or triton)."
            )
    draft_backend = getattr(server_args, "speculative_draft_attention_backend", None)
    if draft_backend is not None and draft_backend not in SUPPORTED_ATTENTION_BACKENDS:
        raise ValueError(
            f"FASER does not support --speculative-draft-attention-backend {draft_backend}: the "
            f"draft's catch-up runs the same forwards as the verify, on {SUPPORTED_ATTENTION_BACKENDS}. "
            "Pass one of those, or leave the flag out to use the target's backend."
        )
    if config.draft_ahead:
        _check_draft_ahead(server_args)
    if server_args.enable_dp_attention:
        raise ValueError("FASER does not support --enable-dp-attention yet; remove the flag.")
    if server_args.pp_size != 1:
        raise ValueError("FASER does not support pipeline parallelism; use --pp-size 1.")
    if getattr(server_args, "speculative_adaptive", False):
        raise ValueError(
            "--speculative-adaptive tunes SGLang's built-in EAGLE/STANDALONE; FASER chooses "
            "per-request lengths itself. Remove the flag."
        )


def _check_draft_ahead(server_args) -> None:
    k = server_args.speculative_num_steps
    if k is not None and int(k) < 2:
        raise ValueError(
            f"FASER config 'draft_ahead' drafts with chains, which need K_max >= 2: pass "
            f"--speculative-num-steps 2 or more (got {k}), or set draft_ahead false."
        )
    backend = getattr(server_args, "speculative_draft_attention_backend", None) or (
        server_args.decode_attention_backend or server_args.attention_backend
    )
    if backend not in DRAFT_AHEAD_BACKENDS:
        raise ValueError(
            f"FASER config 'draft_ahead' needs a draft attention backend that plans on the device "
            f"({DRAFT_AHEAD_BACKENDS}), got {backend or 'the default'}: pass "
            "--speculative-draft-attention-backend triton (FlashInfer plans from host lengths, "
            "which a chain drafted ahead does not have), or set draft_ahead false."
        )


def handle_server_args(server_args) -> None:
    """Fill FASER's defaults into SGLang's speculative fields (SGLang's per-algorithm
    argument hook, the same place built-in algorithms set theirs)."""
    if server_args.speculative_num_steps is None:
        server_args.speculative_num_steps = DEFAULT_DRAFT_LEN
    k = int(server_args.speculative_num_steps)
    server_args.speculative_eagle_topk = 1
    if server_args.speculative_num_draft_tokens not in (None, k + 1):
        logger.warning(
            "FASER verifies at most K_max + 1 tokens per request; "
            "--speculative-num-draft-tokens %s is set to %d.",
            server_args.speculative_num_draft_tokens,
            k + 1,
        )
    server_args.speculative_num_draft_tokens = k + 1
    server_args.enable_mixed_chunk = False


def check_draft_matches_target(target_worker, draft_worker) -> None:
    """Refuse a draft whose vocabulary differs from the target's."""
    target_vocab = target_worker.model_runner.model_config.vocab_size
    draft_vocab = draft_worker.draft_runner.model_config.vocab_size
    if target_vocab != draft_vocab:
        raise ValueError(
            f"FASER needs a draft with the target's vocabulary: target vocab_size="
            f"{target_vocab}, draft vocab_size={draft_vocab}. Use a draft from the same "
            "model family (same tokenizer)."
        )
    t_tok, d_tok = target_worker.tokenizer, draft_worker.tokenizer
    if t_tok is not None and d_tok is not None and t_tok.get_vocab() != d_tok.get_vocab():
        raise ValueError(
            "FASER needs a draft with the target's vocabulary: the tokenizers have the same "
            "size but map tokens to different ids. Use a draft from the same model family."
        )


def _attention_backends(server_args) -> list[str]:
    names = [
        server_args.attention_backend,
        server_args.prefill_attention_backend,
        server_args.decode_attention_backend,
    ]
    return [n for n in names if n is not None]
