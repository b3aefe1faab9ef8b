"""FASER_HOST_PREFILL_PLAN: plan a prefill's FlashInfer attention from host-known lengths.

FlashInfer plans a prefill on the host, from the batch's index pointers (each row's
start in the new tokens, ``qo_indptr``, and in its KV, ``kv_indptr``). SGLang 0.5.17
builds them on the device and hands those to ``plan``, which copies them back
(``.to("cpu")``). That copy waits for every kernel queued before it. On the overlap
schedule a prefill comes right after a step whose GPU work is still running, so the
host sits in the plan for the rest of that step before it launches the prefill's
first layer. On the 13.5B pair's full-depth twins (H100,
``results/gpu/2026-12-07-prefill-wait-h100.md``) that wait was 40-60% of the target's
prefill forward, the eager launch of 48 layers the rest. A FASER draft on FlashInfer
plans the same way in each catch-up (an EXTEND forward inside a decode step).

The scheduler already knows those lengths on the host (``seq_lens_cpu``,
``extend_prefix_lens_cpu``). With the variable set, every server that loads the
plugin, FASER's or not, hands FlashInfer host copies instead, for the plain case
(``plain_case``, ``_plans_on_host``). FlashInfer documents host pointers as the
intended input: its copy back is "only required if qo_indptr/paged_kv_indptr are
device tensors". The plan, the kernels and the tokens are unchanged; the host launches
the prefill while the step before it still runs. The plan copies the host pointers to the device with
non-blocking copies from pageable memory, which do not wait for queued work either
(``scripts/gpu/check_h2d_sync.py``: 0.04-0.12 ms behind 50 ms of it on an H100). After
each plan the wrapper's device pointer buffers are SGLang's tensors again, as they are
without the hook (``_host_plan``).

A plan writes its schedule into a page-locked host buffer of its wrapper and queues
the copy of it to the device. The device copy used to be the first thing to wait for,
so a plan never overwrote a buffer whose copy was still queued. Without that wait the
wrapper takes turns among RING page-locked buffers (``_Ring``): a plan from host
lengths writes into the buffer after the one its wrapper holds, once the last copy out
of that buffer has run. Every call of the hook (every plan of these wrappers, from host
lengths or not) records an event after its plans for the buffers they wrote into. With
one buffer a plan waited for the last copy out of it, so for all work queued before
that copy: after a FASER step whose verify ran as an EXTEND forward, the step's draft
chain, queued before the verify's plan. A buffer's last copy is RING - 1 plans back;
with one step in flight on the overlap schedule, that copy is behind work the GPU has
run. (On an H100 a plan into another buffer needed no wait, and with one buffer host
plans took 25 ms off no-spec's prefills on the twins but 5 ms off FASER-AD's:
``results/gpu/2026-12-07-host-plan-h100.md``.)
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import weakref
from typing import Any, Callable, Optional, Sequence

import torch

ENV = "FASER_HOST_PREFILL_PLAN"
CHECK = "check"
HOST_BACKENDS = ("auto", "fa2", "fa3")  # FlashInfer prefill backends whose plan reads host pointers
UPDATE_SINGLE_WRAPPER = (
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferIndicesUpdaterPrefill.update_single_wrapper"
)

RING = 3  # page-locked schedule buffers a wrapper takes turns among
PINNED = "_pin_memory_int_workspace_buffer"  # FlashInfer's page-locked schedule buffer of a wrapper
FIRST_PLAN_LOG = f"{ENV}: planned a prefill's attention from host lengths"  # logged once per process

logger = logging.getLogger(__name__)


class _Ring:
    """A wrapper's page-locked schedule buffers (its own first; the others made at
    their first turn) and, per buffer, the event recorded after the last call that
    planned into it (None: no copy out of it is queued)."""

    def __init__(self, own: torch.Tensor):
        self.buffers: list[Optional[torch.Tensor]] = [own] + [None] * (RING - 1)
        self.copied: list[Optional[Any]] = [None] * RING
        self.held = 0  # the buffer the wrapper holds

    def next_turn(self, wrapper: Any) -> None:
        """Hand ``wrapper`` the next buffer once the last copy out of it has run."""
        turn = (self.held + 1) % RING
        if self.copied[turn] is not None:
            self.copied[turn].synchronize()
        if self.buffers[turn] is None:
            own = self.buffers[0]
            self.buffers[turn] = torch.empty_like(own, pin_memory=own.is_pinned())
        self.held = turn
        setattr(wrapper, PINNED, self.buffers[turn])


_rings: "weakref.WeakKeyDictionary[Any, _Ring]" = weakref.WeakKeyDictionary()
_first_plan_logged = False


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def checking() -> bool:
    """``FASER_HOST_PREFILL_PLAN=check``: also read the device pointers back (a sync per
    plan) and fail on any that differs from its host copy (GPU tests)."""
    return os.environ.get(ENV) == CHECK


def _check(device_args: tuple, host_args: tuple) -> None:
    for position, (old, new) in enumerate(zip(device_args, host_args)):
        if new is old or not isinstance(old, torch.Tensor):
            continue
        if not torch.equal(old.cpu().to(new.dtype), new):
            raise RuntimeError(
                f"{ENV}: plan argument {position} on the host, {new.tolist()}, differs from "
                f"SGLang's on the device, {old.cpu().tolist()}; unset {ENV}"
            )


def host_indptrs(
    seq_lens: Sequence[int], prefix_lens: Sequence[int], use_ragged: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qo_indptr`` and ``kv_indptr`` ([bs + 1] int32, on the host) as SGLang's
    ``call_begin_forward`` builds them on the device: new tokens per row, and KV per row
    for the paged wrapper (the cached prefix when the ragged wrapper takes the new
    tokens, else the whole sequence)."""
    seq = torch.tensor(list(seq_lens), dtype=torch.int64)
    prefix = torch.tensor(list(prefix_lens), dtype=torch.int64)
    qo = torch.zeros(len(seq) + 1, dtype=torch.int32)
    kv = torch.zeros(len(seq) + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(seq - prefix, dim=0)
    kv[1:] = torch.cumsum(prefix if use_ragged else seq, dim=0)
    return qo, kv


def plain_case(args: inspect.BoundArguments) -> bool:
    """Whether this ``update_single_wrapper`` call is one whose lengths the host knows,
    row for row (as many rows as the device's, the same total), and whose plans take
    nothing else from the device."""
    a = args.arguments
    multi_item = a.get("multi_item_params")
    seq_cpu, prefix_cpu, seq = a.get("seq_lens_cpu"), a.get("extend_prefix_lens_cpu"), a.get("seq_lens")
    return (
        a.get("spec_info") is None
        and seq_cpu is not None
        and prefix_cpu is not None
        and a.get("custom_kv_indices") is None
        and a.get("cross_attention_custom_mask") is None
        and (multi_item is None or not multi_item.is_enabled())
        and len(seq_cpu) == len(prefix_cpu) == len(seq)
        and int(seq_cpu.sum()) == a.get("seq_lens_sum")
    )


# Per wrapper kind, FlashInfer's device buffers that ``plan`` sets from each positional
# pointer: with a device pointer it keeps that tensor itself (``.to(device)`` is a no-op).
RAGGED_BUFFERS = {0: ("_qo_indptr_buf", "_o_indptr_buf"), 1: ("_kv_indptr_buf", "_v_indptr_buf")}
PAGED_BUFFERS = {0: ("_qo_indptr_buf",), 1: ("_paged_kv_indptr_buf",), 3: ("_paged_kv_last_page_len_buf",)}


def _host_plan(
    plan: Callable, wrapper: Any, replace: Callable[[tuple], tuple], buffers: dict[int, tuple[str, ...]]
) -> Callable:
    """``plan`` with its positional pointers replaced by host copies, into the
    wrapper's next page-locked buffer (``_Ring``). Its device buffers are then SGLang's
    tensors again, as without the hook: the copies ``plan`` made from the host pointers
    hold the same values, but freeing them at the next plan would be safe only on the
    stream that planned, and SGLang may plan on a side stream."""

    def host_plan(*args, **kwargs):
        global _first_plan_logged
        _ring(wrapper).next_turn(wrapper)
        host_args = replace(args)
        if checking():
            _check(args, host_args)
        out = plan(*host_args, **kwargs)
        for position, names in buffers.items():
            for name in names:
                setattr(wrapper, name, args[position])
        if not _first_plan_logged:
            _first_plan_logged = True
            logger.info(FIRST_PLAN_LOG)
        return out

    return host_plan


def _ring(wrapper: Any) -> _Ring:
    ring = _rings.get(wrapper)
    if ring is None:
        ring = _rings[wrapper] = _Ring(getattr(wrapper, PINNED))
    return ring


def _mark_copied(wrappers: Sequence[Any]) -> None:
    """Record, after the plans of this call, the event the next plan into each
    wrapper's current buffer waits for: every plan's copy, from host lengths or not (a
    verify's, a speculative extend's), is queued before it."""
    if not torch.cuda.is_available():
        return
    done = torch.cuda.Event()
    done.record()
    for wrapper in wrappers:
        if hasattr(wrapper, PINNED):
            ring = _ring(wrapper)
            ring.copied[ring.held] = done


def _plans_on_host(wrapper: Any) -> bool:
    """Whether ``wrapper``'s plan is FlashInfer's own and computes its schedule from host
    pointers: FA2/FA3 (or "auto", which picks one of them on the first plan). Not a plan
    SGLang installed itself on the wrapper, nor a wrapper for CUDA graphs (it copies
    into fixed buffers), nor a backend that plans from the pointers on the device
    (cutlass)."""
    return (
        "begin_forward" not in vars(wrapper)
        and getattr(wrapper, "_backend", "auto") in HOST_BACKENDS
        and not getattr(wrapper, "is_cuda_graph_enabled", False)
    )


def plan_from_host(original: Callable, *args, **kwargs):
    """AROUND hook on ``FlashInferIndicesUpdaterPrefill.update_single_wrapper``: for
    the plain case, its wrappers' ``begin_forward`` (FlashInfer's ``plan``) take host
    index pointers for the duration of the call. Every call, plain or not, then marks
    the plans of the wrappers it planned as queued (``_mark_copied``)."""
    bound = _signature(original).bind(*args, **kwargs)
    a = bound.arguments
    ragged, paged = a["self"].prefill_wrapper_ragged, a["prefill_wrappers"][0]
    planned = [paged, ragged] if a["use_ragged"] else [paged]  # as SGLang's call_begin_forward plans them
    if not plain_case(bound) or None in planned or not all(_plans_on_host(w) for w in planned):
        out = original(*args, **kwargs)
        _mark_copied([w for w in planned if w is not None])
        return out
    qo, kv = host_indptrs(a["seq_lens_cpu"].tolist(), a["extend_prefix_lens_cpu"], a["use_ragged"])
    last_page = torch.ones(len(qo) - 1, dtype=torch.int32)  # SGLang's pages hold one token
    # ragged: plan(qo_indptr, kv_indptr, ...), both the new tokens' pointers;
    # paged: plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, ...)
    paged.begin_forward = _host_plan(
        paged.begin_forward, paged, lambda p: (qo, kv, p[2], last_page, *p[4:]), PAGED_BUFFERS
    )
    if a["use_ragged"]:
        ragged.begin_forward = _host_plan(ragged.begin_forward, ragged, lambda p: (qo, qo, *p[2:]), RAGGED_BUFFERS)
    try:
        return original(*args, **kwargs)
    finally:
        for wrapper in planned:
            del wrapper.begin_forward
        _mark_copied(planned)


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable) -> inspect.Signature:
    return inspect.signature(fn)

