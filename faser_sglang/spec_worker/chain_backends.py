"""The attention backends the draft chains (draft_chain.py) attend through.

A chain of M forwards attends through one of SGLang's multi-step draft backends of
M + 1 steps: an attention backend per forward, all planned before the first. Two things
differ from the way SGLang's own drafters use them.

One backend for every chain. A drafter of SGLang's has one chain length; FASER has a
chain for each M in 1..K_max + MAX_FORCED_GAP. With a backend each, their attention
state would grow with the sum of the lengths: under CUDA graphs, per forward and per
captured batch size a FlashInfer plan wrapper (8 MiB of device workspace and 8 MiB of
pinned host memory each), and per step a KV-index row of max_bs x context length
entries. At K_max = 7 and the 35 batch sizes SGLang captures up to 128 rows (51 up to
256) that is 36 x 35 = 1260 wrappers (about 9.8 GiB of device and 9.8 GiB of pinned
host memory, outside SGLang's memory plan; 14.3 GiB each at 256 rows), and 44 rows.
Only one chain runs at a time, so every chain is a view of the longest chain's
backend (``ChainBackends``): its first M + 1 steps, with the same per-step attention
backends, buffers and, for each batch size, FlashInfer plan wrappers: 8 x 35 wrappers
and 9 rows. A replay plans each step it runs right before it, as every replay of
SGLang's graphs does, so a graph reads the plans of its own lengths whichever chain
used those wrappers last. That needs at most one chain planned per step and batch
size before the host next waits for the device: a plan's copy to the device reads a
pinned host buffer the next plan of the same wrapper overwrites. A decode step runs
one chain, and the next step plans only after SGLang has waited for this step's
lengths, which come after its chain.

FlashInfer planned from host lengths (``HostPlannedFlashInfer``): SGLang's multi-step
plan reads the KV pointers back from the device, which would hold the host until the
work queued before the chain has finished.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional

import torch
from sglang.kernels.ops.attention.utils import assert_buffer_fits
from sglang.srt.layers.attention import flashinfer_backend
from sglang.srt.layers.attention.flashinfer_backend import FlashInferMultiStepDraftBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.speculative.spec_utils import draft_kv_indices_used_len
from sglang.srt.utils import next_power_of_2

# SGLang 0.5.17's multi-step draft backends whose per-step state is ``attn_backends``
# plus the _PER_STEP tensors, so that their first steps make a working backend of fewer
# steps (these classes exactly, not their subclasses, such as TRT-LLM's of FlashInfer's).
# Others get a backend per chain.
_SHAREABLE = {
    "faser_sglang.spec_worker.chain_backends.HostPlannedFlashInfer",
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferMultiStepDraftBackend",
    "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend",
    "sglang.srt.layers.attention.intel_amx_backend.IntelAMXMultiStepDraftBackend",
}
# Multi-step draft backends that plan a replay with kernels, from the device's lengths
# (Triton's ``generate_draft_decode_kv_indices``; seq_lens_sum None bounds its slices).
_DEVICE_PLANNED = {
    "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend",
    "sglang.srt.layers.attention.intel_amx_backend.IntelAMXMultiStepDraftBackend",
}
# A multi-step backend's tensors with a row per step ([steps, ...]).
_PER_STEP = ("kv_indptr", "cuda_graph_kv_indices")


def chain_kv_indptr(seq_lens: torch.Tensor, steps: int) -> torch.Tensor:
    """[steps, bs + 1] int32 KV pointers of a chain's steps, from the host lengths
    seq_lens [bs] (int64, the lengths before the chain's first token). At step i row z
    attends over seq_lens[z] + i + 1 tokens, laid out row after row in that step's
    kv_indices, as SGLang's ``generate_draft_decode_kv_indices`` packs them (topk = 1).

    seq_lens [5, 3], steps 2 -> [[0, 6, 10], [0, 7, 12]]"""
    lens = seq_lens.unsqueeze(0) + torch.arange(1, steps + 1, dtype=torch.int64).unsqueeze(1)  # [steps, bs]
    indptr = torch.zeros((steps, seq_lens.numel() + 1), dtype=torch.int32)
    indptr[:, 1:] = torch.cumsum(lens, dim=1)
    return indptr


class HostPlannedFlashInfer(FlashInferMultiStepDraftBackend):
    """SGLang's FlashInfer multi-step draft backend, planned from host lengths.

    SGLang's ``common_template`` has a kernel write every step's KV indices and KV
    pointers, then copies the pointers to the host for FlashInfer's plan
    (``kv_indptr.cpu()``). That copy waits for all work queued before it (in a FASER
    step, a catch-up forward, or the previous step's verify and acceptance), so the
    host could not queue the chain and the verify behind it. For a chain (topk = 1) the pointers follow from the host lengths
    (``chain_kv_indptr``); this plans with them and copies them over the kernel's, so
    the pointers the attention reads are the ones FlashInfer planned, also for the
    padding rows of a graph replay (the kernel derives pointers from positions, which
    are 0 there, but lays out the indices by seq_lens).

    The rest is SGLang 0.5.17's ``common_template`` unchanged."""

    def common_template(self, forward_batch: ForwardBatch, kv_indices_buffer: torch.Tensor, call_fn) -> None:
        if self.topk != 1 or forward_batch.seq_lens_cpu is None:
            super().common_template(forward_batch, kv_indices_buffer, call_fn)
            return
        bs = forward_batch.batch_size
        steps = self.speculative_num_steps
        seq_lens_sum = forward_batch.seq_lens_sum
        required = draft_kv_indices_used_len(seq_lens_sum, 1, bs, steps)
        assert_buffer_fits(
            required, kv_indices_buffer.shape[1], "FASER draft chain kv_indices row", bs=bs, seq_lens_sum=seq_lens_sum
        )
        self.generate_draft_decode_kv_indices[(steps, bs, 1)](
            forward_batch.req_pool_indices,
            self.req_to_token_pool.req_to_token,
            forward_batch.seq_lens,
            kv_indices_buffer,
            self.kv_indptr,
            forward_batch.positions,
            self.pool_len,
            kv_indices_buffer.shape[1],
            self.kv_indptr.shape[1],
            next_power_of_2(bs),
            next_power_of_2(steps),
            next_power_of_2(bs),
            self.page_size,
        )
        indptr_cpu = chain_kv_indptr(forward_batch.seq_lens_cpu[:bs].to(torch.int64), steps).pin_memory()
        self.kv_indptr[:, : bs + 1].copy_(indptr_cpu, non_blocking=True)
        for i in range(steps - 1):
            forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][
                : draft_kv_indices_used_len(seq_lens_sum, 1, bs, i + 1)
            ]
            flashinfer_backend.global_override_indptr_cpu = indptr_cpu[i]
            try:
                call_fn(i, forward_batch)
            finally:
                flashinfer_backend.global_override_indptr_cpu = None


def draft_backend(server_args, draft_runner, steps: int):
    """The multi-step attention backend SGLang's drafters use for ``steps`` steps
    (steps - 1 forwards), FlashInfer's planned from host lengths."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    backend = DraftBackendFactory(server_args, draft_runner, 1, steps).create_decode_backend()
    if type(backend) is FlashInferMultiStepDraftBackend:
        backend.__class__ = HostPlannedFlashInfer  # adds no state: only common_template differs
    return backend


class ChainBackends:
    """The multi-step backends of chains of 1..``max_forwards`` forwards: views of one
    backend where SGLang's backend allows it (module docstring), else one each."""

    def __init__(self, server_args, draft_runner, max_forwards: int):
        self._build = functools.partial(draft_backend, server_args, draft_runner)
        self.longest = self._build(max_forwards + 1)
        self.shared = shareable(self.longest)
        if self.shared:
            for step_backend in self.longest.attn_backends:
                reuse_decode_wrappers(step_backend)
        self._graph_state: Optional[tuple[int, int]] = None  # (max_bs, max_num_tokens) once set up

    @property
    def plans_on_device(self) -> bool:
        """Whether a replay plans from the device's lengths alone (no host lengths)."""
        return _qualname(self.longest) in _DEVICE_PLANNED

    def backend(self, forwards: int) -> Any:
        """The multi-step backend of a chain of ``forwards`` forwards (forwards + 1 steps)."""
        steps = forwards + 1
        if steps > self.longest.speculative_num_steps:
            raise ValueError(f"a chain of {forwards} forwards is longer than the longest built")
        if not self.shared:
            return self.longest if steps == self.longest.speculative_num_steps else self._build(steps)
        view = copy.copy(self.longest)
        self._restrict(view, steps)
        return view

    def _restrict(self, view: Any, steps: int) -> None:
        """``view`` = the longest backend's current state, cut to its first ``steps`` steps."""
        view.__dict__.update(vars(self.longest))
        view.speculative_num_steps = steps
        view.attn_backends = self.longest.attn_backends[: steps - 1]
        for name in _PER_STEP:
            if hasattr(self.longest, name):
                setattr(view, name, getattr(self.longest, name)[:steps])
        # SGLang's graph runner sets up graph state once per chain; the state is the longest's.
        view.init_cuda_graph_state = functools.partial(self._init_cuda_graph_state, view)

    def _init_cuda_graph_state(self, view: Any, max_bs: int, max_num_tokens: int) -> None:
        if self._graph_state is None:
            self.longest.init_cuda_graph_state(max_bs, max_num_tokens)
            self._graph_state = (max_bs, max_num_tokens)
        elif self._graph_state != (max_bs, max_num_tokens):
            raise RuntimeError(
                f"FASER draft chains: CUDA graph state set up for (max_bs, max_num_tokens) = "
                f"{self._graph_state}, asked again for {(max_bs, max_num_tokens)}"
            )
        self._restrict(view, view.speculative_num_steps)


def shareable(backend: Any) -> bool:
    """Whether chains of fewer steps can be views of this multi-step backend: a type
    listed in _SHAREABLE whose per-step attention backends, if they are FlashInfer's,
    create their graph wrappers through the hook ``reuse_decode_wrappers`` replaces."""
    if _qualname(backend) not in _SHAREABLE:
        return False
    flashinfer = isinstance(backend, FlashInferMultiStepDraftBackend)
    return not flashinfer or all(hasattr(b, "_create_decode_wrappers") for b in backend.attn_backends)


def reuse_decode_wrappers(step_backend: Any) -> None:
    """Have a per-step FlashInfer backend create one set of CUDA graph decode wrappers
    per batch size, however many graphs capture it. Each capture would otherwise
    create new ones and file them under the batch size (``decode_cuda_graph_metadata``),
    and a replay of an earlier chain's graph would plan wrappers its graph does not
    read. No-op for backends without graph wrappers."""
    create = getattr(step_backend, "_create_decode_wrappers", None)
    if create is None:
        return
    made: dict[int, tuple[int, list]] = {}  # batch size -> (num_tokens, wrappers), as filed

    def create_once(bs: int, num_tokens: int) -> list:
        if bs not in made:
            made[bs] = (num_tokens, create(bs, num_tokens))
        elif made[bs][0] != num_tokens:  # SGLang files one wrapper set per batch size
            raise RuntimeError(
                f"FASER draft chains: graphs of batch size {bs} captured with {made[bs][0]} and "
                f"{num_tokens} tokens; their FlashInfer wrappers cannot be shared"
            )
        return made[bs][1]

    step_backend._create_decode_wrappers = create_once


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
