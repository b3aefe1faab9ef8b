"""How much KV SGLang reserves per request and decode step for a FASER server.

SGLang allocates a decode step's KV before the step, ``get_alloc_reserve_per_decode``
slots past each request's committed length as it records it (``kv_committed_len``):
2 (K_max + 1) for speculative decoding. Under the overlap schedule that recorded length
lags the step's committed length L by up to K_max + 1 (the step before is still being
processed), so a step may only write KV up to position L + K_max: its verify. FASER's
draft chains keep to that (MAX_FORCED_GAP below). A server that drafts ahead
(spec_worker/draft_ahead.py) also writes the next step's chain, further out; the hooks
here (HookRegistry AROUND, plugin.py) raise the reservation to ``ahead_reserve(K_max)``
for it, and widen the request rows (``get_req_to_token_extra_context_len``) to hold the
reservation past a committed length at the end of the context. Every other server keeps
SGLang's numbers.

Light on imports: the plugin loads it in every SGLang process before arguments are parsed.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

from faser_sglang.config import CONFIG_ENV, FaserConfig

ALLOC_RESERVE = "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode"
EXTRA_CONTEXT = "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len"

# Committed tokens a drafting row may lag and still start its chain from them
# (draft_chain.py): 0 after a step that rejected a draft, 1 after one that accepted all
# of the step's longest. At most 1: a chain then writes no further than the step's
# verify (L + K_max), all SGLang's reservation guarantees.
MAX_FORCED_GAP = 1


def ahead_reserve(k_max: int) -> int:
    """KV slots a decode step must find allocated past a request's committed length as
    SGLang records it (``kv_committed_len``, up to K_max + 1 behind the step's L under
    the overlap schedule) when the step also drafts the next one: the step's own K_max + 1
    verify tokens, the next step's K_max + 1, and its chain's K_max - 1 + MAX_FORCED_GAP
    forwards past that step's committed length, plus one (the next bonus).

    K_max 3 -> 12 (SGLang reserves 8); K_max 7 -> 24 (16)."""
    return 3 * k_max + 2 + MAX_FORCED_GAP


def reserve_per_decode(original, server_args=None):
    """SGLang's per-step KV reservation, raised to ``ahead_reserve`` for a server that
    drafts ahead."""
    reserve = original(server_args)
    k_max = _ahead_k_max(server_args)
    return reserve if k_max is None else max(reserve, ahead_reserve(k_max))


def extra_context_len(original, server_args):
    """SGLang's request-row headroom past the context length, wide enough for the
    raised reservation past a committed length at the context's end."""
    extra = original(server_args)
    k_max = _ahead_k_max(server_args)
    return extra if k_max is None else max(extra, ahead_reserve(k_max))


def _ahead_k_max(server_args) -> Optional[int]:
    """K_max of a FASER server that drafts ahead; None for any other server."""
    if server_args is None:
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
    if str(server_args.speculative_algorithm).upper() != "FASER":
        return None
    if not _config(os.environ.get(CONFIG_ENV)).draft_ahead:
        return None
    return int(server_args.speculative_num_steps)


@functools.lru_cache(maxsize=4)
def _config(path: Optional[str]) -> FaserConfig:
    # The reservation is read every decode step; the config file once per path.
    return FaserConfig.from_file(path) if path else FaserConfig()
