"""KV-cache copy kernels: the CPU all-layer copy is real, the rest are placeholders."""

from __future__ import annotations

import ctypes

import torch

from sgl_kernel._missing import missing_getattr

__getattr__ = missing_getattr(__name__)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy slot ``src_loc[i]`` to slot ``tgt_loc[i]`` in every KV buffer.

    The pool hands over raw buffer addresses (``data_ptrs``) and per-slot
    byte strides, so each buffer is viewed as a ``[slots, stride]`` byte
    matrix over just the rows touched. All sources are read before any
    target is written, which keeps overlapping copies safe.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (num_rows * stride)).from_address(address)
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, stride)
        rows[tgt] = rows[src]
