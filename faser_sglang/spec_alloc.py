"""SGLang's KV allocation before a speculative decode step, without its per-request
tensor reads.

``alloc_for_spec_decode`` (sglang/srt/mem_cache/allocation.py) ends with a loop that
records each request's allocated length as ``int(nxt_kv_lens_cpu[i])``: one indexing of
a host tensor per request, ~3 us apiece, 0.37 ms at 128 requests on a 2-core CPU. It
runs in the scheduler's batch pick of every decode step of every speculative server
(no-spec's decode preparation has no such loop); on the 13.5B pair at 65+ requests
FASER-AD's batch pick took 0.88 ms against no-spec's 0.47.

The AROUND hook hands the original those lengths as a Python list where the loop is
their only reader (page size 1; the paged path also gives them to the paged allocator
and keeps the tensor). Same values, same operations; one ``tolist`` costs ~3 us.
Every speculative server that loads the plugin takes it, FASER's and SGLang's own, so
an A/B times neither one's loop.

Light on imports: the plugin loads it in every SGLang process before arguments are parsed.
"""

from __future__ import annotations

from typing import Any, Callable

ALLOC_FOR_SPEC_DECODE = "sglang.srt.mem_cache.allocation.alloc_for_spec_decode"


def lengths_as_list(original: Callable, tree_cache: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``alloc_for_spec_decode`` (its callers pass everything after
    ``tree_cache`` and ``req_to_token_pool`` by keyword)."""
    lengths = kwargs.get("nxt_kv_lens_cpu")
    if hasattr(lengths, "tolist") and tree_cache.token_to_kv_pool_allocator.page_size == 1:
        kwargs["nxt_kv_lens_cpu"] = lengths.tolist()
    return original(tree_cache, *args, **kwargs)
