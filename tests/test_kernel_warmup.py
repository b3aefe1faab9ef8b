"""The startup warm-ups of kernel_warmup.py: SGLang's speculative KV allocation kernel and
the draft's Triton extend attention. Their compiles on a GPU are tested in
tests/gpu/test_gpu_kernel_warmup.py and tests/gpu/test_gpu_faser.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from faser_sglang.spec_worker.kernel_warmup import (
    batch_buckets,
    layer_kinds,
    run_extend_once,
    warm_decode_allocation,
    warm_draft_extend_attention,
)


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


def _attention(heads: int, kv_heads: int, layer_id: int, **kwargs):
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(heads, 64, 0.125, kv_heads, layer_id, **kwargs)


def test_one_layer_of_each_kind():
    same = [_attention(4, 2, i) for i in range(3)]
    wider = _attention(8, 2, 3)
    window = _attention(4, 2, 4, sliding_window_size=128)
    model = torch.nn.ModuleList([*same, wider, window])
    assert layer_kinds(model) == [same[0], wider]


class RecordingBackend:
    """The attributes of SGLang's TritonAttnBackend that run_extend_once reads."""

    def __init__(self):
        self.kv_indptr = torch.zeros(9, dtype=torch.int32)
        self.qo_indptr = torch.zeros(9, dtype=torch.int64)
        self.forward_metadata = "the last batch's"
        self.calls = []

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache):
        self.calls.append((q, k, v, layer, forward_batch, save_kv_cache, self.forward_metadata))


def test_extend_once_per_layer_as_a_model_hands_it_over():
    backend = RecordingBackend()
    layers = [_attention(4, 2, 0), _attention(8, 1, 1)]
    run_extend_once(backend, layers, torch.bfloat16, torch.device("cpu"))
    assert backend.forward_metadata == "the last batch's"  # restored
    assert [call[3] for call in backend.calls] == layers
    for (q, k, v, layer, forward_batch, save_kv_cache, meta), (heads, kv_heads) in zip(backend.calls, [(4, 2), (8, 1)]):
        width = (heads + 2 * kv_heads) * 64
        # Views of one fused QKV row: q 2-D as RadixAttention passes it, k and v per head.
        assert q.shape == (2, heads * 64) and q.stride() == (width, 1)
        assert k.shape == v.shape == (2, kv_heads, 64) and k.stride() == v.stride() == (width, 64, 1)
        assert q.dtype == k.dtype == torch.bfloat16
        assert forward_batch is None and save_kv_cache is False
        assert meta.max_extend_len == 2 and meta.custom_mask is None and meta.mask_indptr is None
        assert meta.qo_indptr.tolist() == [0, 2] and meta.qo_indptr.dtype == torch.int64
        assert meta.kv_indptr.tolist() == [0, 0] and meta.kv_indptr.dtype == torch.int32
        assert meta.kv_indices.numel() == 0 and meta.kv_indices.dtype == torch.int64


def test_metadata_restored_when_the_extend_fails():
    backend = RecordingBackend()

    def fail(*args, **kwargs):
        raise RuntimeError("no kernel")

    backend.forward_extend = fail
    with pytest.raises(RuntimeError, match="no kernel"):
        run_extend_once(backend, [_attention(4, 2, 0)], torch.bfloat16, torch.device("cpu"))
    assert backend.forward_metadata == "the last batch's"


def test_no_extend_warm_up_off_triton_or_off_cuda():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    model = torch.nn.ModuleList([_attention(4, 2, 0)])
    other = SimpleNamespace(attn_backend=object(), device="cuda", model=model, dtype=torch.bfloat16)
    assert warm_draft_extend_attention(other) == 0
    triton_on_cpu = SimpleNamespace(
        attn_backend=object.__new__(TritonAttnBackend), device="cpu", model=model, dtype=torch.bfloat16
    )
    assert warm_draft_extend_attention(triton_on_cpu) == 0


def test_a_failed_extend_warm_up_leaves_the_kernel_cold(monkeypatch, caplog):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from faser_sglang.spec_worker import kernel_warmup

    backend = object.__new__(TritonAttnBackend)
    backend.enable_deterministic, backend.dcp_size = False, 1

    def fail(*args):
        raise ValueError("an attention layout the warm-up does not know")

    monkeypatch.setattr(kernel_warmup, "run_extend_once", fail)
    runner = SimpleNamespace(
        attn_backend=backend, device="cuda", model=torch.nn.ModuleList([_attention(4, 2, 0)]), dtype=torch.bfloat16
    )
    with caplog.at_level("WARNING", logger=kernel_warmup.__name__):
        assert warm_draft_extend_attention(runner) == 0
    assert "left the draft's Triton extend attention cold (ValueError: an attention layout" in caplog.text
