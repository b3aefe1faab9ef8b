"""Host-to-device copies that do not stall the host.

``torch.tensor(values, device="cuda")`` copies synchronously: the host waits until the
GPU has finished everything queued before it. Between forwards FASER builds small
index tensors (rows, positions, lengths) from host-side lists; copied with
``non_blocking=True`` they let the host queue the next forward while the GPU still runs
the previous one. CUDA stages pageable host memory before the call returns, so the
source may be dropped right after. ``scripts/gpu/check_h2d_sync.py`` times such a copy
behind queued GPU work (H200: 0.05-1.2 ms for 8-16384 ints, against the queued work's
wait for a blocking copy).
"""

from __future__ import annotations

from typing import Sequence

import torch


def device_tensor(values: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """[len(values)] tensor of ``dtype`` on ``device``, copied without a host sync."""
    return torch.tensor(list(values), dtype=dtype).to(device, non_blocking=True)


# Triton specializes a kernel on whether each pointer argument is 16-byte aligned.
TRITON_ALIGNMENT = 16


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` where its data starts on a 16-byte boundary, else a copy of it (which does).

    FASER packs several [n] int64 index rows into one tensor and copies it in one go
    (``device_tensor(...).view(k, n)``), so row i starts 8 * i * n bytes in: unaligned
    for odd i * n. A Triton kernel compiles one variant per alignment of each pointer it
    takes, so such a row handed to SGLang's kernels (the multi-step draft backend's index
    kernel, one variant per batch-size bucket and chain length already compiled at
    graph capture from aligned buffers) compiles again inside the scheduler's loop, a
    100-300 ms stall. An int64 row of one batch is tiny to copy."""
    return t if t.data_ptr() % TRITON_ALIGNMENT == 0 else t.clone()
