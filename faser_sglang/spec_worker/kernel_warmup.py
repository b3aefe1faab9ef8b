"""Compile at startup the Triton kernels a FASER server would otherwise compile in the
middle of serving, so that a burst does not wait for the compiler.

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

``warm_draft_extend_attention``: a draft on SGLang's Triton attention backend runs its
EXTEND forwards (eager draft prefills, catch-ups too long for its decode graphs) through
the Triton extend attention kernel, whose compile-time constants come from the draft's
layers (head dims, block sizes). Graph capture runs only DECODE forwards, and under a
lazy draft prefill SGLang's warm-up request never reaches the draft's EXTEND: the first
long catch-up of the bursty A/B compiled it in the scheduler's loop (py-spy: 2.3 s in
``extend_attention_fwd``). The warm-up runs the backend's own ``forward_extend`` once per
kind of draft attention layer, two new tokens over an empty prefix, and writes no KV.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)

# The request row every warm-up launch names; its empty ranges write nothing there.
ANY_ROW = 0
# New tokens of the extend warm-up's one request: with one, a view's row stride is free and
# the kernel's stride arguments could differ from a real extend's (Triton specializes them).
EXTEND_TOKENS = 2


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


def _layer_kind(layer: Any) -> tuple:
    """What of a draft attention layer reaches the extend kernel's specialization: head
    counts and dims (block sizes, strides), the compile-time logit cap and temperature
    length, and what decides causality (the softmax scale is a plain float argument)."""
    return (
        layer.tp_q_head_num, layer.tp_k_head_num, layer.tp_v_head_num, layer.qk_head_dim, layer.v_head_dim,
        layer.logit_cap, layer.logit_capping_method, layer.xai_temperature_len,
        layer.is_cross_attention, layer.attn_type,
    )  # fmt: skip


def layer_kinds(model: torch.nn.Module) -> list[Any]:
    """One attention layer of each kind in ``model``, sliding-window layers left out (their
    extend reads window metadata)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    kinds: dict[tuple, Any] = {}
    for module in model.modules():
        if isinstance(module, RadixAttention) and module.sliding_window_size < 0:
            kinds.setdefault(_layer_kind(module), module)
    return list(kinds.values())


def run_extend_once(backend: Any, layers: list[Any], dtype: torch.dtype, device: torch.device) -> None:
    """``backend.forward_extend`` once per layer: one request, two new tokens, no prefix,
    the inputs laid out as a model's forward hands them over. Writes no KV; the backend's
    forward metadata is restored afterwards."""
    from sglang.srt.layers.attention.triton_backend import ForwardMetadata

    saved = backend.forward_metadata
    try:
        for layer in layers:
            q_width = layer.tp_q_head_num * layer.qk_head_dim
            k_width = layer.tp_k_head_num * layer.qk_head_dim
            v_width = layer.tp_v_head_num * layer.v_head_dim
            qkv = torch.zeros(EXTEND_TOKENS, q_width + k_width + v_width, dtype=dtype, device=device)  # fused QKV out
            q = qkv[:, :q_width]  # [tokens, q_width], as RadixAttention passes it
            k = qkv[:, q_width : q_width + k_width].view(-1, layer.tp_k_head_num, layer.qk_head_dim)
            v = qkv[:, q_width + k_width :].view(-1, layer.tp_v_head_num, layer.v_head_dim)
            # As init_forward_metadata builds an EXTEND's, for the batch above.
            backend.forward_metadata = ForwardMetadata(
                attn_logits=None, attn_lse=None, max_extend_len=EXTEND_TOKENS, num_kv_splits=None,
                kv_indptr=torch.zeros(2, dtype=backend.kv_indptr.dtype, device=device),
                kv_indices=torch.empty(0, dtype=torch.int64, device=device),
                qo_indptr=torch.tensor([0, EXTEND_TOKENS], dtype=backend.qo_indptr.dtype, device=device),
                custom_mask=None, mask_indptr=None, window_kv_indptr=None, window_kv_indices=None,
                window_num_kv_splits=None, window_kv_offsets=None,
            )  # fmt: skip
            backend.forward_extend(q, k, v, layer, forward_batch=None, save_kv_cache=False)
    finally:
        backend.forward_metadata = saved


def warm_draft_extend_attention(runner: Any) -> int:
    """Compile the Triton extend attention for every kind of attention layer of
    ``runner`` (the draft's ModelRunner). Returns the kinds warmed: 0 off CUDA, for
    another attention backend, or where the backend takes another kernel (deterministic
    inference, decode context parallelism) or where the warm-up fails, which it logs: the
    draft's first EXTEND then compiles the kernel, as without the warm-up."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = runner.attn_backend
    device = torch.device(runner.device)
    if not isinstance(backend, TritonAttnBackend) or device.type != "cuda":
        return 0
    if backend.enable_deterministic or backend.dcp_size > 1:
        return 0
    started = time.perf_counter()
    layers = layer_kinds(runner.model)
    try:
        run_extend_once(backend, layers, runner.dtype, device)
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - a warm-up only saves time; the first EXTEND compiles instead
        logger.warning("FASER: left the draft's Triton extend attention cold (%s: %s)", type(exc).__name__, exc)
        return 0
    logger.info(
        "FASER: compiled the draft's Triton extend attention for %d kind(s) of layer in %.1f s",
        len(layers),
        time.perf_counter() - started,
    )
    return len(layers)
