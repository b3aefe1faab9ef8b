"""The startup warm-up of SGLang's speculative KV allocation kernel (kernel_warmup.py);
its compiles on a GPU are tested in tests/gpu/test_gpu_kernel_warmup.py."""

from __future__ import annotations

import pytest
import torch

from faser_sglang.spec_worker.kernel_warmup import batch_buckets, warm_decode_allocation


@pytest.mark.parametrize(
    "max_batch, buckets",
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 4]), (64, [1, 2, 4, 8, 16, 32, 64]), (100, [1, 2, 4, 8, 16, 32, 64, 128])],
)
def test_buckets_cover_every_batch_size(max_batch, buckets):
    assert batch_buckets(max_batch) == buckets
    # Every batch size SGLang may decode rounds up to one of them.
    assert all(1 << (bs - 1).bit_length() in buckets for bs in range(1, max_batch + 1))


def test_buckets_need_a_batch():
    with pytest.raises(ValueError, match="at least 1"):
        batch_buckets(0)


def test_nothing_to_compile_off_cuda():
    req_to_token = torch.full((4, 16), -1, dtype=torch.int32)
    assert warm_decode_allocation(req_to_token, 4) == 0
    assert bool((req_to_token == -1).all())
