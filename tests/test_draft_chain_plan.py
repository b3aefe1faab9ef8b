"""The draft chain's host-side KV pointers (draft_chain.chain_kv_indptr) against the
KV indices SGLang's own kernel lays out, run in Triton's CPU interpreter; and the
message a chain capture that runs out of device memory stops the server with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from faser_sglang.spec_worker import draft_chain
from faser_sglang.spec_worker.chain_backends import chain_kv_indptr

# A graph replay's batch: three real rows padded to five, as EAGLEDraftCudaGraphRunner
# pads them (seq_lens and seq_lens_cpu filled with 1, positions and pool rows with 0).
STEPS = 4
SEQ_LENS = [5, 3, 9, 1, 1]
POSITIONS = [5, 3, 9, 0, 0]
POOL_ROWS = [2, 0, 3, 0, 0]
REAL_ROWS = 3
POOL_LEN = 64
WIDTH = 128

_KERNEL = f"""
import json, torch
from sglang.srt.speculative.spec_utils import generate_draft_decode_kv_indices
from sglang.srt.utils import next_power_of_2
bs = {len(SEQ_LENS)}
req_to_token = torch.arange(4 * {POOL_LEN}, dtype=torch.int32).view(4, {POOL_LEN})
kv_indices = torch.full(({STEPS}, {WIDTH}), -1, dtype=torch.int32)
kv_indptr = torch.zeros(({STEPS}, bs + 1), dtype=torch.int32)
generate_draft_decode_kv_indices[({STEPS}, bs, 1)](
    torch.tensor({POOL_ROWS}), req_to_token, torch.tensor({SEQ_LENS}), kv_indices, kv_indptr,
    torch.tensor({POSITIONS}), {POOL_LEN}, {WIDTH}, bs + 1,
    next_power_of_2(bs), next_power_of_2({STEPS}), next_power_of_2(bs), 1,
)
print(json.dumps({{"indptr": kv_indptr.tolist(), "indices": kv_indices.tolist()}}))
"""


def _sglang_kernel() -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's generate_draft_decode_kv_indices on the batch above: (kv_indptr
    [STEPS, bs + 1], kv_indices [STEPS, WIDTH]). The interpreter must be chosen before
    Triton compiles the kernel, hence a fresh process."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _KERNEL], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return torch.tensor(got["indptr"]), torch.tensor(got["indices"])


def test_chain_kv_indptr_worked_example():
    assert chain_kv_indptr(torch.tensor([5, 3]), 2).tolist() == [[0, 6, 10], [0, 7, 12]]


def test_host_pointers_match_sglang_kernel_and_its_index_layout():
    kernel_indptr, indices = _sglang_kernel()
    ours = chain_kv_indptr(torch.tensor(SEQ_LENS), STEPS)
    # Real rows: the same pointers the kernel writes.
    assert torch.equal(ours[:, : REAL_ROWS + 1], kernel_indptr[:, : REAL_ROWS + 1].to(torch.int32))
    # Every row, padding included: our pointers frame exactly the indices the kernel laid
    # out for that row (its pool row's first seq_len + i + 1 slots)...
    req_to_token = torch.arange(4 * POOL_LEN, dtype=torch.int32).view(4, POOL_LEN)
    for i in range(STEPS):
        for z, (row, n) in enumerate(zip(POOL_ROWS, SEQ_LENS)):
            framed = indices[i, ours[i, z] : ours[i, z + 1]]
            assert torch.equal(framed, req_to_token[row, : n + i + 1].to(framed.dtype)), (i, z)
    # ...which the kernel's own pointers for padding rows do not (it reads positions,
    # 0 there): hence the host pointers are copied over the kernel's.
    assert not torch.equal(ours[:, REAL_ROWS + 1 :], kernel_indptr[:, REAL_ROWS + 1 :].to(torch.int32))


def test_chain_capture_out_of_memory_names_the_fix(monkeypatch):
    """Running out of device memory while capturing the chains (outside SGLang's memory
    plan) stops the server with the flags and FASER settings that leave them room."""
    def capture(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(draft_chain, "DraftChains", capture)
    server_args = SimpleNamespace(
        device="cpu", disable_cuda_graph=True, mem_fraction_static=0.88,
        cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(max_bs=128)),
    )  # fmt: skip
    with pytest.raises(RuntimeError) as info:
        draft_chain.build_draft_chains(server_args, None, 4, enabled=True, sampled=True)
    message = str(info.value)
    assert "ran out of GPU memory capturing the draft chains" in message
    assert "--mem-fraction-static (now 0.88)" in message and "--cuda-graph-max-bs-decode (now 128)" in message
    assert '"sampled_chain": false' in message and '"draft_chain": false' in message


class _Built(Exception):
    """Stops ``_draft`` once it has built its forward batch."""


def test_chain_hands_the_backend_aligned_index_rows(monkeypatch):
    """A chain's rows come packed in one copy ([3, n] in ``run``, [4, n] in
    ``draft_ahead``), so a row may start 8 bytes off a 16-byte boundary. The forward
    batch the backend's Triton index kernel reads gets aligned ones (a misaligned
    pointer is another kernel variant, compiled inside the scheduler's loop)."""
    built = {}

    def forward_batch(**kwargs):
        built.update(kwargs)
        raise _Built

    monkeypatch.setattr(draft_chain, "ForwardBatch", forward_batch)
    chains = draft_chain.DraftChains.__new__(draft_chain.DraftChains)
    chains.forced = torch.zeros((8, 3), dtype=torch.int64)
    chains.gaps = torch.zeros(8, dtype=torch.int64)
    chains.req_to_token = torch.arange(4 * POOL_LEN, dtype=torch.int32).view(4, POOL_LEN)
    chains.draft_runner = SimpleNamespace(spec_algorithm=None)
    n = 3
    packed = torch.tensor([0, 1, 0, 5, 3, 9, 2, 0, 3]).view(3, n)  # gaps, starts, pool rows
    fed, pool_rows = packed[1], packed[2]
    assert fed.data_ptr() % 16 == 8  # odd n: the middle row starts off the boundary
    with pytest.raises(_Built):
        chains._draft(pool_rows, fed, packed[0], torch.zeros((n, 1), dtype=torch.int64), 2, 1, None, None, None, None)
    for name in ("req_pool_indices", "seq_lens", "positions"):
        assert built[name].data_ptr() % 16 == 0, name
    assert built["seq_lens"].tolist() == [5, 3, 9] and built["req_pool_indices"].tolist() == [2, 0, 3]
