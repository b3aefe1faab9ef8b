"""device_tensor: host lists to index tensors without a host sync."""

from __future__ import annotations

import torch

from faser_sglang.tensors import device_tensor


def test_device_tensor_keeps_values_and_dtype():
    t = device_tensor((3, 1, 4), "cpu")
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 4]
    assert device_tensor([2, 7], "cpu", dtype=torch.int32).dtype == torch.int32
    assert device_tensor([], "cpu").shape == (0,)
