"""ForwardBatches for the draft and verify forwards, built from SGLang's ScheduleBatch.

FASER runs forwards SGLang's scheduler never plans (a ragged verify chunk per
request, the draft's catch-up and decode steps). Each is an ordinary EXTEND or
DECODE forward over some rows of the running batch, so we describe it as a shallow
copy of the ScheduleBatch with the token-level fields replaced and let SGLang's own
``ForwardBatch.init_new`` derive positions and attention metadata. The running
batch itself is never modified.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from faser_sglang.tensors import device_tensor


@dataclass(frozen=True)
class RowSelection:
    """Rows of the running batch, in batch order; a row may repeat (one decode row
    per chunk token, chunk_forward.py)."""

    rows_cpu: tuple[int, ...]
    rows: torch.Tensor  # [n] int64 on the batch device

    @classmethod
    def of(cls, rows: Sequence[int], device: torch.device | str) -> "RowSelection":
        rows_cpu = tuple(int(r) for r in rows)
        return cls(rows_cpu, device_tensor(rows_cpu, device))


def _select_rows(batch: ScheduleBatch, sel: Optional[RowSelection]) -> ScheduleBatch:
    view = copy.copy(batch)
    # Plain forwards: no speculative input for attention backends or graph runners.
    view.spec_algorithm = SpeculativeAlgorithm.NONE
    view.spec_info = None
    view.return_logprob = False
    view.return_hidden_states = False
    view.return_hidden_states_mode = CaptureHiddenMode.NULL
    view.extend_input_logprob_token_ids = None
    view.input_embeds = None
    view.multimodal_inputs = None
    view.global_num_tokens = None
    view.global_num_tokens_for_logprob = None
    if sel is not None and sel.rows_cpu != tuple(range(len(batch.reqs))):
        view.reqs = [batch.reqs[i] for i in sel.rows_cpu]
        view.req_pool_indices = batch.req_pool_indices[sel.rows]
        if batch.req_pool_indices_cpu is not None:
            view.req_pool_indices_cpu = batch.req_pool_indices_cpu[list(sel.rows_cpu)]
        # The sampling of FASER forwards happens in the worker; SGLang's forward
        # must not see another row count's sampling state.
        view.sampling_info = None
        view.has_grammar = False
    return view


def _set_lengths(view: ScheduleBatch, seq_lens_cpu: Sequence[int], device) -> None:
    seq_lens_t = torch.tensor(list(seq_lens_cpu), dtype=torch.int64)
    view.seq_lens_cpu = seq_lens_t
    view.seq_lens = seq_lens_t.to(device, non_blocking=True)
    view.orig_seq_lens = view.seq_lens.to(torch.int32)
    view.seq_lens_sum = int(seq_lens_t.sum())


def extend_forward_batch(
    batch: ScheduleBatch,
    runner,
    *,
    sel: Optional[RowSelection],
    input_ids: torch.Tensor,  # [sum(extend_lens)] int64
    prefix_lens: Sequence[int],  # [n] tokens already in this model's KV per row
    extend_lens: Sequence[int],  # [n] new tokens per row
    out_cache_loc: torch.Tensor,  # [sum(extend_lens)] KV slots for the new tokens
    capture_hidden_mode: CaptureHiddenMode,
) -> ForwardBatch:
    """An EXTEND forward: row r feeds extend_lens[r] tokens after prefix_lens[r]."""
    view = _select_rows(batch, sel)
    view.forward_mode = ForwardMode.EXTEND
    view.is_extend_in_batch = True
    view.input_ids = input_ids
    view.out_cache_loc = out_cache_loc
    view.prefix_lens = [int(x) for x in prefix_lens]
    view.extend_lens = [int(x) for x in extend_lens]
    view.extend_num_tokens = sum(view.extend_lens)
    view.extend_logprob_start_lens = list(view.extend_lens)
    _set_lengths(view, [p + e for p, e in zip(view.prefix_lens, view.extend_lens)], batch.device)
    return ForwardBatch.init_new(
        view,
        runner,
        capture_hidden_mode=capture_hidden_mode,
        return_hidden_states_before_norm=False,
    )


def decode_forward_batch(
    batch: ScheduleBatch,
    runner,
    *,
    sel: Optional[RowSelection],
    input_ids: torch.Tensor,  # [n] int64
    seq_lens_cpu: Sequence[int],  # [n] lengths including the token fed now
    out_cache_loc: torch.Tensor,  # [n] KV slot of the token fed now
) -> ForwardBatch:
    """A DECODE forward: one token per row at position seq_len - 1."""
    view = _select_rows(batch, sel)
    view.forward_mode = ForwardMode.DECODE
    view.is_extend_in_batch = False
    view.input_ids = input_ids
    view.out_cache_loc = out_cache_loc
    _set_lengths(view, seq_lens_cpu, batch.device)
    return ForwardBatch.init_new(
        view,
        runner,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        return_hidden_states_before_norm=False,
    )


def kv_slots(
    req_to_token: torch.Tensor,  # [max_reqs, max_context] int32
    req_pool_indices: torch.Tensor,  # [n] int64
    starts: torch.Tensor,  # [n] int64 first position per row
    lens: torch.Tensor,  # [n] int64 positions per row
    total: int,  # sum(lens), known on the host
) -> torch.Tensor:
    """KV slot of each position start_r .. start_r + len_r - 1, rows concatenated. [total] int64.

    req_pool_indices = [5, 2], starts = [10, 3], lens = [2, 1]
      -> [req_to_token[5, 10], req_to_token[5, 11], req_to_token[2, 3]]
    """
    row_of_token = torch.repeat_interleave(
        torch.arange(lens.shape[0], device=lens.device), lens, output_size=total
    )  # [total]
    first_token = torch.cumsum(lens, 0) - lens  # [n]
    offset = torch.arange(total, device=lens.device) - first_token[row_of_token]
    positions = starts[row_of_token] + offset
    return req_to_token[req_pool_indices[row_of_token], positions].to(torch.int64)
