"""The target's KV memory plan counts the FASER draft's KV.

SGLang sizes the shared KV pool from the target's memory plan: the bytes left after the
weights (the draft's included) under ``--mem-fraction-static``, divided by the bytes
one token's KV takes (``DefaultPoolConfigurator._cell_size``). FASER's draft keeps a KV
pool of its own with as many tokens (a token's draft KV lives at the same slot index as
its target KV, draft_model.py), so a plan that counted the target alone would leave
the draft's pool to the memory SGLang keeps free for activations and CUDA graphs, and
the server could run out of device memory at startup or under load. SGLang counts its
own EAGLE and STANDALONE drafts the same way, by scaling the target's bytes per token
(assuming the draft's layers are the target's size); FASER adds the draft's own bytes
per token, computed by SGLang's configurator for the draft's model, KV dtype and
tensor-parallel split.

The draft worker exists before the target's plan runs (SGLang builds the speculative
worker, loading the draft's weights, then allocates the pools), so the worker records
the draft's bytes per token (``note_draft``) and the hook on SGLang's configurator
factory (``count_draft_kv``) adds them to the target's. After the pools exist the
worker compares the draft pool SGLang allocated with what was counted
(``check_draft_pool``).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

CREATE_CONFIGURATOR = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"

# The draft's KV bytes per token in this process (one scheduler process per rank, one
# FASER worker in it); None until the worker has built its draft.
_draft_bytes: Optional[int] = None
_counted: Optional[tuple[int, int]] = None  # (target, draft) bytes per token, once counted


def kv_bytes_per_token(configurator: Any) -> Optional[int]:
    """A SGLang pool configurator's KV bytes per token, or None where its plan is not
    one size per token (hybrid sliding-window and compressed-attention models)."""
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    if type(configurator) is not DefaultPoolConfigurator:
        return None
    return int(configurator._cell_size)


def note_draft(draft_runner: Any) -> None:
    """Record the draft's KV bytes per token, as SGLang's configurator will size the
    draft's pool (its KV dtype, layers and heads per rank), for the target's plan."""
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    global _draft_bytes
    draft_runner.init_kv_cache_configurator()  # alloc_memory_pool builds it again
    _draft_bytes = kv_bytes_per_token(create_memory_pool_configurator(draft_runner.kv_cache_configurator))
    if _draft_bytes is None:
        logger.warning(
            "FASER memory plan: the draft %s has no single KV size per token, so the target's "
            "plan cannot count its KV pool; pass --max-total-tokens so both pools fit.",
            draft_runner.model_config.model_path,
        )


def count_draft_kv(original, kvc, *args, **kwargs):
    """Hook (AROUND ``create_memory_pool_configurator``): a FASER target's configurator
    divides the KV budget by the target's and the draft's bytes per token."""
    configurator = original(kvc, *args, **kwargs)
    if kvc.is_draft_worker or not _is_faser(kvc.spec_algorithm) or _draft_bytes is None:
        return configurator
    target = kv_bytes_per_token(configurator)
    if target is None:  # check_draft_pool warns
        return configurator
    global _counted
    configurator._cell_size = target + _draft_bytes
    if _counted != (target, _draft_bytes):
        _counted = (target, _draft_bytes)
        logger.info(
            "FASER memory plan: %d KV bytes per token (target %d + draft %d)",
            target + _draft_bytes,
            target,
            _draft_bytes,
        )
    return configurator


def check_draft_pool(draft_pool: Any, tokens: int) -> None:
    """After allocation: warn if the target's plan did not count the draft's KV, or
    counted less than the draft's pool takes (``tokens``: the size of both pools)."""
    if _draft_bytes is None:  # note_draft warned
        return
    if _counted is None:
        logger.warning(
            "FASER memory plan: the target's plan is not one KV size per token and does not "
            "count the draft's KV pool; pass --max-total-tokens (or a lower "
            "--mem-fraction-static) so both pools fit."
        )
        return
    sizes = getattr(draft_pool, "get_kv_size_bytes", None)
    if sizes is None or tokens <= 0:
        return
    # A pool's buffers hold page_size slots past its size (SGLang's padding slot 0).
    per_token = sum(sizes()) / (tokens + getattr(draft_pool, "page_size", 0))
    if per_token > _counted[1] * 1.001:
        logger.warning(
            "FASER memory plan: the draft's KV pool takes %.0f bytes per token, the plan "
            "counted %d; pass --max-total-tokens (or a lower --mem-fraction-static) so "
            "both pools fit.",
            per_token,
            _counted[1],
        )


def _is_faser(spec_algorithm: Any) -> bool:
    from faser_sglang.plugin import FaserSpecAlgo

    return isinstance(spec_algorithm, FaserSpecAlgo)
