"""Request checks on a FASER server: refuse what FASER cannot serve losslessly, and
malformed requests that would otherwise take the server down, with an HTTP 400.

SGLang turns a ``ValueError`` raised while it builds a request into a 400 answer.
This guard wraps that step (``TokenizerManager._create_tokenized_object``) and the
length check before it (``_validate_one_request``) through HookRegistry, and acts
only when the server's algorithm is FASER:
- sampling features FASER's verify step does not apply yet (penalties,
  ``min_new_tokens``, grammar constraints, custom logit processors) are refused
  instead of silently ignored;
- wrongly typed sampling parameters (a ``TypeError`` in SGLang's length check or
  constructor, which SGLang 0.5.17 answers with a 500) become a 400;
- values SGLang 0.5.17 accepts but then crashes its scheduler on (token ids outside
  the vocabulary, ``top_logprobs_num`` above the vocabulary, ``logprob_start_len``
  below -1) and ``n < 1`` are refused.
"""

from __future__ import annotations

from typing import Any, Optional

TOKENIZE_STEP = "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object"
VALIDATE_STEP = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
ALGORITHM_NAME = "FASER"


def unsupported_feature(sp: Any) -> Optional[str]:
    """The first sampling feature FASER does not apply yet, or None."""
    if getattr(sp, "frequency_penalty", 0.0) != 0.0:
        return "frequency_penalty"
    if getattr(sp, "presence_penalty", 0.0) != 0.0:
        return "presence_penalty"
    if getattr(sp, "repetition_penalty", 1.0) != 1.0:
        return "repetition_penalty"
    if (getattr(sp, "min_new_tokens", 0) or 0) > 0:
        return "min_new_tokens"
    for grammar in ("json_schema", "regex", "ebnf", "structural_tag"):
        if getattr(sp, grammar, None) is not None:
            return f"{grammar} (grammar-constrained decoding)"
    return None


def request_error(req: Any, vocab_size: int) -> Optional[str]:
    """Why a tokenized generate request must be refused, or None."""
    sp = getattr(req, "sampling_params", None)
    if sp is None:  # embedding and other non-generate requests
        return None
    feature = unsupported_feature(sp)
    if feature is None and getattr(req, "custom_logit_processor", None):
        feature = "custom_logit_processor"
    if feature is not None:
        return (
            f"FASER does not support {feature} yet; send the request without it or use a "
            "server without speculative decoding"
        )
    n = getattr(sp, "n", 1)
    if n is not None and n < 1:
        return f"n must be >= 1, got {n}"
    ids = getattr(req, "input_ids", None)
    if ids is not None and len(ids) > 0 and (min(ids) < 0 or max(ids) >= vocab_size):
        return f"input_ids must be in [0, {vocab_size}), got values in [{min(ids)}, {max(ids)}]"
    if getattr(req, "return_logprob", False):
        start = getattr(req, "logprob_start_len", -1)
        if start is not None and start < -1:
            return f"logprob_start_len must be >= -1, got {start}"
        top = getattr(req, "top_logprobs_num", 0) or 0
        if top > vocab_size:
            return f"top_logprobs_num must be <= the vocabulary size {vocab_size}, got {top}"
    return None


def _is_faser(manager: Any) -> bool:
    return str(getattr(manager.server_args, "speculative_algorithm", "")).upper() == ALGORITHM_NAME


def _call_as_bad_request(original, manager, *args, **kwargs):
    """Run SGLang's step; a TypeError from a wrongly typed parameter becomes a 400."""
    try:
        return original(manager, *args, **kwargs)
    except TypeError as e:
        raise ValueError(f"invalid request parameter: {e}") from e


def guard_validate(original, manager, *args, **kwargs):
    """AROUND hook on SGLang's input + max_new_tokens length check."""
    if not _is_faser(manager):
        return original(manager, *args, **kwargs)
    return _call_as_bad_request(original, manager, *args, **kwargs)


def guard_tokenize(original, manager, *args, **kwargs):
    """AROUND hook on SGLang's request-building step (see the module docstring)."""
    if not _is_faser(manager):
        return original(manager, *args, **kwargs)
    req = _call_as_bad_request(original, manager, *args, **kwargs)
    error = request_error(req, manager.model_config.vocab_size)
    if error is not None:
        raise ValueError(error)
    return req
