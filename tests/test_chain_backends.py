"""Every draft chain attends through a view of one multi-step backend
(spec_worker/chain_backends.py): the longest chain's first steps, sharing its per-step
backends, buffers and FlashInfer graph wrappers."""

from __future__ import annotations

import pytest
import torch

from faser_sglang.spec_worker import chain_backends
from faser_sglang.spec_worker.chain_backends import ChainBackends, HostPlannedFlashInfer, reuse_decode_wrappers

STEPS = 5  # the longest chain: 4 forwards
WIDTH = 16  # kv_indices entries per step row


class FakeStepBackend:
    """A per-step attention backend that records its graph setup and creates a new
    wrapper object on every call, as FlashInfer's does."""

    def __init__(self) -> None:
        self.graph_states: list[torch.Tensor] = []
        self.created = 0

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf: torch.Tensor) -> None:
        self.graph_states.append(kv_indices_buf)

    def _create_decode_wrappers(self, bs: int, num_tokens: int) -> list:
        self.created += 1
        return [object()]


def fake_flashinfer(steps: int) -> HostPlannedFlashInfer:
    """A FlashInfer multi-step backend's state without SGLang's constructor (which needs
    a GPU), and a graph setup that allocates on the CPU."""
    backend = object.__new__(HostPlannedFlashInfer)
    backend.topk = 1
    backend.speculative_num_steps = steps
    backend.kv_indptr = torch.zeros((steps, 9), dtype=torch.int32)
    backend.attn_backends = [FakeStepBackend() for _ in range(steps - 1)]
    backend.setups = 0

    def init_cuda_graph_state(max_bs: int, max_num_tokens: int) -> None:
        backend.setups += 1
        backend.cuda_graph_kv_indices = torch.zeros((steps, WIDTH), dtype=torch.int32)
        for i, step in enumerate(backend.attn_backends):
            step.init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf=backend.cuda_graph_kv_indices[i])

    backend.init_cuda_graph_state = init_cuda_graph_state
    return backend


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """draft_backend replaced by fake FlashInfer backends; the step counts built."""
    steps_built: list[int] = []

    def build(server_args, draft_runner, steps: int):
        steps_built.append(steps)
        return fake_flashinfer(steps)

    monkeypatch.setattr(chain_backends, "draft_backend", build)
    return steps_built


def test_chains_are_views_of_the_longest_backend(built):
    backends = ChainBackends(None, None, STEPS - 1)
    views = {m: backends.backend(m) for m in range(1, STEPS)}
    assert built == [STEPS] and backends.shared  # one backend built, whatever the chains
    for m, view in views.items():
        assert view.speculative_num_steps == m + 1
        assert view.attn_backends == backends.longest.attn_backends[:m]
        assert view.kv_indptr.shape[0] == m + 1
        assert view.kv_indptr.data_ptr() == backends.longest.kv_indptr.data_ptr()
        assert type(view) is HostPlannedFlashInfer
    with pytest.raises(ValueError, match="longer than the longest"):
        backends.backend(STEPS)


def test_graph_state_is_set_up_once_and_shared(built):
    backends = ChainBackends(None, None, STEPS - 1)
    views = [backends.backend(m) for m in range(1, STEPS)]
    for view in views:  # as each chain's graph runner does
        view.init_cuda_graph_state(8, 8)
    assert backends.longest.setups == 1
    assert [len(s.graph_states) for s in backends.longest.attn_backends] == [1] * (STEPS - 1)
    rows = backends.longest.cuda_graph_kv_indices
    for view in views:
        steps = view.speculative_num_steps
        assert view.cuda_graph_kv_indices.shape == (steps, WIDTH)
        assert view.cuda_graph_kv_indices.data_ptr() == rows.data_ptr()
    with pytest.raises(RuntimeError, match="set up for"):
        views[0].init_cuda_graph_state(16, 16)


def test_graph_captures_reuse_one_wrapper_set_per_batch_size(built):
    backends = ChainBackends(None, None, STEPS - 1)
    step = backends.longest.attn_backends[0]
    first = step._create_decode_wrappers(4, 4)  # chain 1 captures batch size 4
    assert step._create_decode_wrappers(4, 4) is first  # chain 2 at the same size
    assert step._create_decode_wrappers(8, 8) is not first
    assert step.created == 2
    with pytest.raises(RuntimeError, match="cannot be shared"):
        step._create_decode_wrappers(4, 8)


def test_other_multistep_backends_get_a_backend_per_chain(monkeypatch):
    class OtherMultiStep:  # not a type whose first steps make a smaller backend
        def __init__(self, steps: int) -> None:
            self.speculative_num_steps = steps
            self.attn_backends = [object() for _ in range(steps - 1)]

    built: list[int] = []

    def build(server_args, draft_runner, steps: int):
        built.append(steps)
        return OtherMultiStep(steps)

    monkeypatch.setattr(chain_backends, "draft_backend", build)
    backends = ChainBackends(None, None, 3)
    assert not backends.shared
    assert [backends.backend(m).speculative_num_steps for m in (1, 2, 3)] == [2, 3, 4]
    assert built == [4, 2, 3] and backends.backend(3) is backends.longest


def test_subclasses_of_shareable_backends_are_not_shared(monkeypatch):
    """A subclass (TRT-LLM's of FlashInfer's multi-step backend) may keep per-step state
    of its own: it gets a backend per chain."""
    subclass = type("TRTLLMLikeMultiStep", (HostPlannedFlashInfer,), {})

    def build(server_args, draft_runner, steps: int):
        backend = fake_flashinfer(steps)
        backend.__class__ = subclass
        return backend

    monkeypatch.setattr(chain_backends, "draft_backend", build)
    assert not ChainBackends(None, None, 3).shared


def test_reusing_wrappers_leaves_backends_without_them_alone():
    plain = type("NoWrappers", (), {})()  # Triton's and the CPU's per-step backends
    reuse_decode_wrappers(plain)
    assert not hasattr(plain, "_create_decode_wrappers")
