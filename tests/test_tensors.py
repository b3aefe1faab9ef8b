"""device_tensor and to_device: host data to the device without a host sync."""

from __future__ import annotations

import torch

from faser_sglang.tensors import device_tensor, to_device


def test_device_tensor_keeps_values_and_dtype():
    t = device_tensor((3, 1, 4), "cpu")
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 4]
    assert device_tensor([2, 7], "cpu", dtype=torch.int32).dtype == torch.int32
    assert device_tensor([], "cpu").shape == (0,)


def test_device_tensor_takes_any_iterable_and_to_device_copies():
    assert device_tensor(iter(range(3)), "cpu", dtype=torch.int32).tolist() == [0, 1, 2]
    host = torch.tensor([5, 6])
    moved = to_device(host, "cpu")
    assert moved.tolist() == [5, 6] and moved.device.type == "cpu"
