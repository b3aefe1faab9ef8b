"""device_tensor: host lists to index tensors without a host sync."""

from __future__ import annotations

import torch

from faser_sglang.tensors import aligned, device_tensor


def test_device_tensor_keeps_values_and_dtype():
    t = device_tensor((3, 1, 4), "cpu")
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 4]
    assert device_tensor([2, 7], "cpu", dtype=torch.int32).dtype == torch.int32
    assert device_tensor([], "cpu").shape == (0,)


def test_aligned_copies_only_a_tensor_off_the_16_byte_boundary():
    base = torch.arange(6, dtype=torch.int64)  # allocations start aligned
    assert aligned(base) is base
    view = base[1:4]  # 8 bytes in
    assert view.data_ptr() % 16 == 8
    copy = aligned(view)
    assert copy.data_ptr() % 16 == 0 and copy.tolist() == [1, 2, 3]
    assert aligned(base[2:4]).data_ptr() == base[2:4].data_ptr()  # 16 bytes in: kept
