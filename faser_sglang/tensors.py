"""Host-to-device copies that do not stall the host.

A copy from pageable host memory to the GPU (``torch.tensor(values, device="cuda")``,
and ``.to("cuda", non_blocking=True)`` of a pageable tensor too) makes the host wait
until the GPU has finished everything queued before it: CUDA stages pageable memory
in stream order. Between forwards FASER builds small index tensors (rows, positions,
lengths) and a prefill's prompt ids from host-side lists; staged in pinned memory and
copied with ``non_blocking=True`` they let the host queue the next forward while the
GPU still runs the previous one, as SGLang's overlap schedule expects. The caching
host allocator keeps a pinned block until the copy that reads it has run, so the
source may be dropped right after. ``scripts/gpu/check_h2d_sync.py`` measures both
kinds of copy behind queued GPU work.
"""

from __future__ import annotations

from typing import Iterable

import torch


def device_tensor(values: Iterable[int], device: torch.device | str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """[len(values)] tensor of ``dtype`` on ``device``, copied without a host sync."""
    if torch.device(device).type != "cuda":
        return torch.tensor(list(values), dtype=dtype, device=device)
    return torch.tensor(list(values), dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor's copy on ``device``, without a host sync (pinned staging)."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
