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
