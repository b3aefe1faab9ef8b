"""Paged decode / extend attention as ``torch.ops.sgl_kernel`` custom ops.

SGLang's ``intel_amx`` attention backend calls
``torch.ops.sgl_kernel.decode_attention_cpu`` and
``torch.ops.sgl_kernel.extend_attention_cpu``. These are float32 reference
implementations of the C++ CPU kernels with the argument lists SGLang 0.5.17
passes (decode: 17 arguments, extend: 19; no k_scale/v_scale, no trailing
is_causal). They favour clarity over speed: one vectorized attention per
request.

Shared semantics (from the C++ kernels):
* KV slots of request b are ``req_to_token[req_pool_indices[b], off:off+len]``
  where ``off`` is the encoder length for self-attention of encoder-decoder
  models (0 otherwise).
* query head h reads KV head ``h // (num_heads // num_kv_heads)`` (GQA).
* scores are ``scale * q.k``, then ``cap * tanh(s / cap)`` when logit_cap > 0.
* a sliding window w > 0 lets a query at position p see keys j >= p - w + 1.
* sinks (one logit per head) only enlarge the softmax denominator.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of q [M, H, D] over k [N, Hkv, D], v [N, Hkv, Dv] -> [M, H, Dv].

    ``allowed`` is an optional [M, N] bool mask of visible keys.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads for {num_kv_heads} kv heads")
    if k.shape[0] == 0:
        return q.new_zeros(q.shape[0], num_heads, v.shape[-1], dtype=torch.float32)
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, _NEG_INF)
    if sinks is not None:
        sink_col = sinks.float().view(num_heads, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)
        probs = probs[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def _window_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int
) -> torch.Tensor:
    """[M, N] mask of keys inside each query's sliding window (all True if w <= 0)."""
    if window <= 0:
        return torch.ones(query_pos.numel(), key_pos.numel(), dtype=torch.bool)
    return key_pos[None, :] >= query_pos[:, None] - window + 1


def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor | None,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per request over its cached sequence; writes ``output``.

    The new token's key/value (when given) are first stored at ``loc``, so
    the query attends to itself. ``seq_lens`` includes that token.
    ``attn_logits`` is the C++ kernel's split-KV scratch and is unused here.
    """
    if key is not None:
        if value is None or loc is None:
            raise ValueError("key, value and loc must be given together")
        k_buffer[loc] = key.to(k_buffer.dtype)
        v_buffer[loc] = value.to(v_buffer.dtype)

    for b in range(seq_lens.shape[0]):
        seq_len = int(encoder_lens[b] if is_cross_attn else seq_lens[b])
        offset = (
            int(encoder_lens[b])
            if encoder_lens is not None and not is_cross_attn
            else 0
        )
        if 0 < sliding_window_size < seq_len:
            offset, seq_len = seq_len - sliding_window_size, sliding_window_size
        slots = req_to_token[req_pool_indices[b], offset : offset + seq_len].long()
        out = _attend(
            query[b : b + 1],
            k_buffer[slots],
            v_buffer[slots],
            None,
            sm_scale,
            logit_cap,
            sinks,
        )
        output[b] = out[0].to(output.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
) -> None:
    """Prefill/extend attention; writes ``o_extend`` and never the KV cache.

    Request b's ``extend_seq_lens[b]`` new tokens (rows from
    ``extend_start_loc[b]`` of q/k/v_extend) attend to the cached prefix of
    length ``seq_lens[b] - extend_seq_lens[b]`` (read through req_to_token)
    and causally to each other. With ``tree_mask`` (speculative verify,
    QLEN_ONLY layout ``[bs, max_len_extend, max_len_extend]``) the mask
    replaces causality among the new tokens; the prefix stays fully visible.
    Cross-attention reads only the ``encoder_lens[b]`` cached encoder tokens.
    """
    if tree_mask is not None:
        tree_mask = tree_mask.reshape(-1, max_len_extend, max_len_extend)
    for b in range(seq_lens.shape[0]):
        ext_len = int(extend_seq_lens[b])
        if ext_len == 0:
            continue
        start = int(extend_start_loc[b])
        prefix_len = int(seq_lens[b]) - ext_len
        if prefix_len < 0:
            raise ValueError(f"request {b}: seq_len {int(seq_lens[b])} < extend {ext_len}")
        rows = slice(start, start + ext_len)
        query_pos = torch.arange(prefix_len, prefix_len + ext_len)

        if is_cross_attn:
            cached = int(encoder_lens[b])
            offset = 0
        else:
            cached = prefix_len
            offset = int(encoder_lens[b]) if encoder_lens is not None else 0
        slots = req_to_token[req_pool_indices[b], offset : offset + cached].long()
        keys, values = k_buffer[slots], v_buffer[slots]
        allowed = _window_mask(query_pos, torch.arange(cached), sliding_window_size)

        if not is_cross_attn:
            keys = torch.cat([keys, k_extend[rows].to(keys.dtype)])
            values = torch.cat([values, v_extend[rows].to(values.dtype)])
            if tree_mask is not None:
                if ext_len != max_len_extend:
                    raise ValueError("tree_mask needs uniform extend lengths")
                among_new = tree_mask[b].to(torch.bool)
            else:
                among_new = torch.ones(ext_len, ext_len, dtype=torch.bool).tril()
            among_new = among_new & _window_mask(
                query_pos, query_pos, sliding_window_size
            )
            allowed = torch.cat([allowed, among_new], dim=1)

        out = _attend(
            q_extend[rows], keys, values, allowed, sm_scale, logit_cap, sinks
        )
        o_extend[rows] = out.to(o_extend.dtype)


# Mutated arguments are annotated (a!) so functionalization and
# torch.compile see the in-place writes.
_library = torch.library.Library("sgl_kernel", "DEF")
_library.define(
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, "
    "Tensor(c!) output, Tensor? key, Tensor? value, Tensor? loc, "
    "Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
    "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
    "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
)
_library.define(
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
    "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
    "Tensor extend_start_loc, int max_len_extend, float sm_scale, "
    "float logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask) -> ()"
)
_library.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
_library.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
