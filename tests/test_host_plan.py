"""FASER_HOST_PREFILL_PLAN (host_plan.py): a prefill's FlashInfer plans get host copies
of the index pointers SGLang builds on the device, the same values, and nothing else
changes. These tests run SGLang's own ``update_single_wrapper`` and ``call_begin_forward``
on the CPU with wrappers that record their plans; on a GPU, the greedy test with
``FASER_HOST_PREFILL_PLAN=check`` (tests/gpu/test_gpu_faser.py) compares every plan's
pointers with the device's and the tokens with no-spec's."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention import flashinfer_backend as fb

from faser_sglang import host_plan

ORIGINAL = fb.FlashInferIndicesUpdaterPrefill.update_single_wrapper
HEADS = (4, 2, 16)  # num_qo_heads, num_kv_heads, head_dim


class RecordingWrapper:
    """Stands in for a FlashInfer prefill wrapper: keeps every plan's arguments and, as
    FlashInfer's eager plan does, keeps its pointers as device buffers (a copy of a host
    pointer, the tensor itself for a device one; on the CPU every one is copied)."""

    def __init__(self):
        self.plans: list[tuple[tuple, dict]] = []
        self._pin_memory_int_workspace_buffer = torch.empty(64, dtype=torch.uint8)
        self.schedule_buffers: list[torch.Tensor] = []  # the page-locked buffer of each plan

    def begin_forward(self, *args, **kwargs):
        self.plans.append((args, kwargs))
        self.schedule_buffers.append(getattr(self, host_plan.PINNED))
        names = host_plan.PAGED_BUFFERS if len(args) > 3 and torch.is_tensor(args[3]) else host_plan.RAGGED_BUFFERS
        for position, attributes in names.items():
            for name in attributes:
                setattr(self, name, args[position].clone())


class _KvIndices:
    """SGLang's Triton kernel that gathers each row's KV slots, in Python."""

    def __getitem__(self, grid):
        def run(req_to_token, req_pool_indices, lens, kv_indptr, kv_start_idx, kv_indices, stride):
            for i in range(grid[0]):
                start = 0 if kv_start_idx is None else int(kv_start_idx[i])
                n = int(lens[i])
                row = req_to_token[int(req_pool_indices[i])]
                kv_indices[int(kv_indptr[i]) : int(kv_indptr[i]) + n] = row[start : start + n]

        return run


@pytest.fixture(autouse=True)
def python_kv_indices(monkeypatch):
    monkeypatch.setattr(fb, "create_flashinfer_kv_indices_triton", _KvIndices())


def updater(max_bs: int = 8) -> fb.FlashInferIndicesUpdaterPrefill:
    u = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    u.num_qo_heads, u.num_kv_heads, u.head_dim = HEADS
    u.q_data_type = u.data_type = torch.bfloat16
    u.attn_backend = SimpleNamespace(dq_paged_kernel_lens=None)
    u.kv_indptr = [torch.zeros(max_bs + 1, dtype=torch.int32)]
    u.qo_indptr = [torch.zeros(max_bs + 1, dtype=torch.int32)]
    u.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32)
    u.req_to_token = torch.arange(8 * 64, dtype=torch.int32).reshape(8, 64)
    u._swa_kv_pool = None
    u.prefill_wrapper_ragged = RecordingWrapper()
    return u


def prefill(u, seq_lens: list[int], prefix_lens: list[int], use_ragged: bool, hooked: bool, original=ORIGINAL,
            **overrides):  # fmt: skip
    """One ``update_single_wrapper`` call as SGLang's extend path makes it (through the
    hook when ``hooked``, around ``original``). Returns the ragged and the paged
    wrapper's plans."""
    kwargs = dict(
        req_pool_indices=torch.arange(len(seq_lens)),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        seq_lens_sum=sum(seq_lens),
        prefix_lens=torch.tensor(prefix_lens),
        prefill_wrappers=[RecordingWrapper()],
        use_ragged=use_ragged,
        encoder_lens=None,
        spec_info=None,
        fixed_split_size=None,
        multi_item_params=fb.MultiItemScoringParams(),
        cross_attention_custom_mask=None,
        extend_prefix_lens_cpu=list(prefix_lens),
        custom_kv_indices=None,
    )
    kwargs.update(overrides)
    if hooked:
        host_plan.plan_from_host(original, u, **kwargs)
    else:
        ORIGINAL(u, **kwargs)
    return u.prefill_wrapper_ragged.plans, kwargs["prefill_wrappers"][0].plans


def test_host_indptrs_count_new_tokens_and_the_paged_kv():
    qo, kv = host_plan.host_indptrs([5, 9, 3], [2, 0, 3], use_ragged=True)
    assert qo.dtype == kv.dtype == torch.int32
    assert qo.tolist() == [0, 3, 12, 12]
    assert kv.tolist() == [0, 2, 2, 5]  # the prefixes: the ragged wrapper takes the new tokens
    _, kv = host_plan.host_indptrs([5, 9, 3], [2, 0, 3], use_ragged=False)
    assert kv.tolist() == [0, 5, 14, 17]  # whole sequences


def random_batch(seed: int) -> tuple[list[int], list[int]]:
    """1-8 rows of up to 64 tokens, each with a cached prefix of up to all of them."""
    g = torch.Generator().manual_seed(seed)
    bs = int(torch.randint(1, 9, (1,), generator=g))
    seq = torch.randint(1, 65, (bs,), generator=g).tolist()
    return seq, [int(torch.randint(0, n + 1, (1,), generator=g)) for n in seq]


@pytest.mark.parametrize("use_ragged", [True, False])
@pytest.mark.parametrize("batch", [([7, 12, 4], [3, 0, 4])] + [random_batch(seed) for seed in range(12)])
def test_plans_get_host_copies_of_sglangs_pointers(use_ragged, batch):
    seq, prefix = batch
    plain = prefill(updater(), seq, prefix, use_ragged, hooked=False)
    u = updater()
    hooked = prefill(u, seq, prefix, use_ragged, hooked=True)
    for (device_args, device_kwargs), (host_args, host_kwargs) in zip(plain[0] + plain[1], hooked[0] + hooked[1]):
        assert host_kwargs == device_kwargs
        assert len(host_args) == len(device_args)
        for d, h in zip(device_args, host_args):
            if isinstance(d, torch.Tensor) and len(d) > len(seq) + 1:  # KV slots: SGLang over-allocates
                total = int(device_args[1][-1])
                assert torch.equal(h[:total], d[:total])
            elif isinstance(d, torch.Tensor):
                assert torch.equal(h, d)
            else:
                assert h == d
    ragged_plans, paged_plans = hooked
    assert len(ragged_plans) == (1 if use_ragged else 0) and len(paged_plans) == 1
    (qo, kv, kv_indices, last_page, *rest), _ = paged_plans[0]
    buffers = (u.qo_indptr[0], u.kv_indptr[0], u.kv_last_page_len)
    for host, buffer in zip((qo, kv, last_page), buffers):
        assert host.data_ptr() != buffer.data_ptr()  # its own tensor, not SGLang's device buffer
    assert rest[:3] == list(HEADS)


@pytest.mark.parametrize("use_ragged", [True, False])
def test_the_wrappers_keep_sglangs_device_buffers(use_ragged):
    """After the plan, the wrappers hold SGLang's own pointer tensors, as without the
    hook, not the copies the plan made of the host ones (freed at the next plan)."""
    u = updater()
    paged = RecordingWrapper()
    prefill(u, [7, 12, 4], [3, 0, 4], use_ragged, hooked=True, prefill_wrappers=[paged])
    qo, kv, last = u.qo_indptr[0].data_ptr(), u.kv_indptr[0].data_ptr(), u.kv_last_page_len.data_ptr()
    assert (paged._qo_indptr_buf.data_ptr(), paged._paged_kv_indptr_buf.data_ptr()) == (qo, kv)
    assert paged._paged_kv_last_page_len_buf.data_ptr() == last
    if use_ragged:
        ragged = u.prefill_wrapper_ragged
        buffers = (ragged._qo_indptr_buf, ragged._o_indptr_buf, ragged._kv_indptr_buf, ragged._v_indptr_buf)
        assert [b.data_ptr() for b in buffers] == [qo] * 4


def test_without_the_ragged_wrapper_its_backend_does_not_matter():
    u = updater()
    u.prefill_wrapper_ragged._backend = "cutlass"  # never planned without the ragged path
    paged = RecordingWrapper()
    prefill(u, [7, 4], [3, 0], use_ragged=False, hooked=True, prefill_wrappers=[paged])
    (qo, *_), _ = paged.plans[0]
    assert qo.data_ptr() != u.qo_indptr[0].data_ptr()  # planned from host pointers


def stand_in(body):
    """``body`` with the signature of SGLang's ``update_single_wrapper``, which the hook reads."""
    return functools.wraps(ORIGINAL)(body)


def test_wrappers_are_left_as_they_were():
    u = updater()
    prefill(u, [6], [2], use_ragged=True, hooked=True)
    assert "begin_forward" not in vars(u.prefill_wrapper_ragged)
    patched = []

    @stand_in
    def failing(updater, *args, prefill_wrappers, **kwargs):
        wrappers = (updater.prefill_wrapper_ragged, prefill_wrappers[0])
        patched.append(all("begin_forward" in vars(w) for w in wrappers))
        raise ValueError("plan failed")

    u = updater()
    paged = RecordingWrapper()
    with pytest.raises(ValueError, match="plan failed"):
        prefill(u, [6], [2], use_ragged=True, hooked=True, original=failing, prefill_wrappers=[paged])
    assert patched == [True]
    assert "begin_forward" not in vars(u.prefill_wrapper_ragged) and "begin_forward" not in vars(paged)


@pytest.mark.parametrize(
    "override",
    [
        {"spec_info": object()},
        {"seq_lens_cpu": None},
        {"extend_prefix_lens_cpu": None},
        {"custom_kv_indices": torch.zeros(1)},
        {"cross_attention_custom_mask": torch.zeros(1)},
        {"multi_item_params": SimpleNamespace(is_enabled=lambda: True)},
        {"extend_prefix_lens_cpu": [2, 0]},  # more rows on the host than on the device
        {"seq_lens_sum": 7},  # another total than the host lengths'
    ],
    ids=lambda o: next(iter(o)),
)
def test_other_cases_go_through_unchanged(override):
    u = updater()
    calls = []

    @stand_in
    def original(updater, *args, prefill_wrappers, **kwargs):
        calls.append(kwargs)
        assert "begin_forward" not in vars(updater.prefill_wrapper_ragged)
        assert "begin_forward" not in vars(prefill_wrappers[0])

    prefill(u, [6], [2], use_ragged=True, hooked=True, original=original, **override)
    assert len(calls) == 1 and all(calls[0][k] is v for k, v in override.items())


@pytest.mark.parametrize("which", ["ragged", "paged"])
@pytest.mark.parametrize("installed", ["a plan SGLang installed", "cutlass", "cuda graph"])
def test_wrappers_that_do_not_plan_from_host_pointers_go_through_unchanged(which, installed):
    u = updater()
    paged = RecordingWrapper()
    wrapper = u.prefill_wrapper_ragged if which == "ragged" else paged
    if installed == "cutlass":
        wrapper._backend = "cutlass"
    elif installed == "cuda graph":
        wrapper.is_cuda_graph_enabled = True
    else:
        wrapper.begin_forward = functools.partial(RecordingWrapper.begin_forward, wrapper)
    calls = []

    @stand_in
    def original(updater, *args, prefill_wrappers, **kwargs):
        calls.append(vars(wrapper).get("begin_forward"))

    prefill(u, [6], [2], use_ragged=True, hooked=True, original=original, prefill_wrappers=[paged])
    assert calls == [vars(wrapper).get("begin_forward")]  # SGLang's own, or none


def test_plans_from_host_lengths_take_turns_among_page_locked_buffers(monkeypatch):
    """Each call records an event after its plans for the buffers they wrote into; a
    plan from host lengths writes into its wrapper's next buffer, once the event of the
    last call that wrote into that one has passed (the buffer was that copy's source).
    A plan not from host lengths (a verify's) writes into the buffer the wrapper holds."""
    log: list[tuple[str, int]] = []

    class Event:
        count = 0

        def __init__(self):
            Event.count += 1
            self.n = Event.count

        def record(self):
            log.append(("record", self.n))

        def synchronize(self):
            log.append(("wait", self.n))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    u = updater()
    paged = RecordingWrapper()
    own = {w: getattr(w, host_plan.PINNED) for w in (u.prefill_wrapper_ragged, paged)}

    @stand_in
    def speculative(updater, *args, **kwargs):
        log.append(("plan", 0))

    prefill(u, [6], [2], use_ragged=True, hooked=True, original=speculative, prefill_wrappers=[paged],
            spec_info=object())  # fmt: skip
    for n in range(4):
        prefill(u, [6 + n], [2], use_ragged=True, hooked=True, prefill_wrappers=[paged])
    # calls 2 and 3 write into fresh buffers; 4 and 5 into the first two again, after
    # the events of calls 1 and 2 (both wrappers wait for the same event)
    assert log == [("plan", 0), ("record", 1), ("record", 2), ("record", 3), ("wait", 1), ("wait", 1),
                   ("record", 4), ("wait", 2), ("wait", 2), ("record", 5)]  # fmt: skip
    for wrapper in (u.prefill_wrapper_ragged, paged):
        ring = [b.data_ptr() for b in wrapper.schedule_buffers]
        assert len(set(ring)) == host_plan.RING == 3 and ring[3] == ring[0]
        assert own[wrapper].data_ptr() == ring[2]  # the wrapper's own buffer takes its turn
        assert all(b.shape == own[wrapper].shape and b.dtype == own[wrapper].dtype for b in wrapper.schedule_buffers)


def test_the_first_plan_from_host_lengths_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(host_plan, "_first_plan_logged", False)
    with caplog.at_level("INFO", logger=host_plan.__name__):
        prefill(updater(), [6], [2], use_ragged=True, hooked=True)
        prefill(updater(), [6], [2], use_ragged=True, hooked=True)
    assert [r.getMessage() for r in caplog.records] == [host_plan.FIRST_PLAN_LOG]


def test_check_mode_fails_on_a_pointer_that_differs(monkeypatch):
    monkeypatch.setenv(host_plan.ENV, host_plan.CHECK)
    prefill(updater(), [7, 4], [3, 0], use_ragged=True, hooked=True)  # the same: passes
    with pytest.raises(RuntimeError, match=host_plan.ENV):
        prefill(updater(), [7, 4], [3, 0], use_ragged=True, hooked=True, extend_prefix_lens_cpu=[2, 0])


@pytest.mark.parametrize("value, on, check", [(None, False, False), ("0", False, False), ("1", True, False),
                                              ("check", True, True)])  # fmt: skip
def test_enabled_by_the_variable(value, on, check, monkeypatch):
    if value is None:
        monkeypatch.delenv(host_plan.ENV, raising=False)
    else:
        monkeypatch.setenv(host_plan.ENV, value)
    assert host_plan.enabled() is on and host_plan.checking() is check


def test_the_plugin_registers_the_hook_with_the_variable():
    script = (
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "from faser_sglang import host_plan, plugin\n"
        "plugin.register()\n"
        "print([h for _, h, _ in HookRegistry._hooks[host_plan.UPDATE_SINGLE_WRAPPER]] == [host_plan.plan_from_host])\n"
    )
    env = {**os.environ, host_plan.ENV: "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]
