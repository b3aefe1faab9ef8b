"""Compile at startup the Triton kernel SGLang's speculative decode path specializes
per batch size, so that a burst does not wait for the compiler.

Before every speculative decode step SGLang's scheduler writes the step's new KV slots
into the request rows (``eagle_prepare_for_decode`` -> ``alloc_for_spec_decode`` ->
``assign_req_to_token_pool``, sglang/srt/mem_cache/allocation.py). That Triton kernel
takes ``bs_upper = next_power_of_2(batch size)`` as a compile-time constant, and Triton
specializes a pointer on whether it is 16-byte aligned: ``out_cache_loc`` is a slice of
the KV allocator's int64 free list, aligned or not by the parity of what was handed
out before it. So a server compiles two variants each time its decode batch first
reaches a new power of two, each ~0.1 s with a cold Triton cache, inside the
scheduler's loop: on a fresh H200 the first burst of the bursty A/B stalled 0.7 s in
six of them, while its batch grew from 21 to 79 requests. SGLang without speculation
takes another path and never compiles this kernel in its decode steps.

``warm_decode_allocation`` launches the kernel once per (power of two up to the
largest decode batch, alignment) with empty ranges, which write nothing.
"""

from __future__ import annotations

import logging
import time

import torch

logger = logging.getLogger(__name__)

# The request row every warm-up launch names; its empty ranges write nothing there.
ANY_ROW = 0


def batch_buckets(max_batch: int) -> list[int]:
    """The powers of two a decode batch of 1..``max_batch`` requests rounds up to:
    one per compiled variant of ``bs_upper``.

    max_batch 1 -> [1]; 100 -> [1, 2, 4, 8, 16, 32, 64, 128]"""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    buckets = [1]
    while buckets[-1] < max_batch:
        buckets.append(2 * buckets[-1])
    return buckets


def warm_decode_allocation(req_to_token: torch.Tensor, max_batch: int) -> int:
    """Compile ``assign_req_to_token_pool`` for every decode batch size up to
    ``max_batch``, with ``out_cache_loc`` aligned and not, on ``req_to_token``'s device
    (its row width is a compile-time constant too). Returns the number of launches: 0
    off CUDA, where SGLang writes the rows with a host loop."""
    if not req_to_token.is_cuda:
        return 0
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func

    started = time.perf_counter()
    device = req_to_token.device
    free_list = torch.zeros(2, dtype=torch.int64, device=device)  # as the allocator's
    locs = (free_list[:1], free_list[1:])  # 16-byte aligned, then 8 bytes past it
    launches = 0
    for bs in batch_buckets(max_batch):
        rows = torch.full((bs,), ANY_ROW, dtype=torch.int64, device=device)  # [bs]
        lens = torch.zeros(bs, dtype=torch.int32, device=device)  # [bs] start = end
        for loc in locs:
            assign_req_to_token_pool_func(rows, req_to_token, lens, lens, loc, bs)
            launches += 1
    torch.cuda.synchronize(device)
    logger.info(
        "FASER: compiled SGLang's speculative KV allocation kernel for decode batches up to %d "
        "(%d variants) in %.1f s",
        max_batch,
        launches,
        time.perf_counter() - started,
    )
    return launches
