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


def _set_lengths(
    view: ScheduleBatch, seq_lens_cpu: Sequence[int], device, seq_lens: Optional[torch.Tensor] = None
) -> None:
    """The view's lengths from the host's; ``seq_lens``: the same already on the device."""
    seq_lens_t = torch.tensor(list(seq_lens_cpu), dtype=torch.int64)
    view.seq_lens_cpu = seq_lens_t
    view.seq_lens = seq_lens_t.to(device, non_blocking=True) if seq_lens is None else seq_lens
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
    seq_lens: Optional[torch.Tensor] = None,  # [n] int64 seq_lens_cpu on the device, if there already
) -> ForwardBatch:
    """A DECODE forward: one token per row at position seq_len - 1."""
    view = _select_rows(batch, sel)
    view.forward_mode = ForwardMode.DECODE
    view.is_extend_in_batch = False
    view.input_ids = input_ids
    view.out_cache_loc = out_cache_loc
    _set_lengths(view, seq_lens_cpu, batch.device, seq_lens)
    return ForwardBatch.init_new(
        view,
        runner,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        return_hidden_states_before_norm=False,
    )


def request_pool_rows(batch: ScheduleBatch) -> list[int]:
    """[bs] each request's request-pool row, from the host: SGLang's host copy of
    ``req_pool_indices`` (which filtering and merging keep in step with it), else the
    requests' own ``req_pool_idx``."""
    if batch.req_pool_indices_cpu is not None:
        return batch.req_pool_indices_cpu.tolist()
    return [req.req_pool_idx for req in batch.reqs]


@dataclass(frozen=True)
class ChunkTokens:
    """The tokens of a chunk (chunk_forward.py), rows concatenated, each with its
    batch row and position: built on the host, where the lengths are, and copied to the
    device once, so a forward's indices cost one copy and one gather.

    rows [0, 2], starts [10, 4], lens [2, 1], request-pool rows of the batch [5, 7, 3]
      -> rows_cpu (0, 0, 2), positions_cpu (10, 11, 4), pool rows [5, 5, 3]
    """

    rows_cpu: tuple[int, ...]  # [n] batch row of each token
    positions_cpu: tuple[int, ...]  # [n] position of each token
    packed: torch.Tensor  # [3, n] int64 on the device: batch rows, positions, request-pool rows

    @classmethod
    def of(
        cls, batch: ScheduleBatch, rows: Sequence[int], starts: Sequence[int], lens: Sequence[int]
    ) -> "ChunkTokens":
        token_rows: list[int] = []
        positions: list[int] = []
        pool_rows: list[int] = []
        pool = request_pool_rows(batch)
        for row, start, n in zip(rows, starts, lens):
            token_rows.extend([row] * n)
            positions.extend(range(start, start + n))
            pool_rows.extend([pool[row]] * n)
        packed = device_tensor(token_rows + positions + pool_rows, batch.seq_lens.device)
        return cls(tuple(token_rows), tuple(positions), packed.view(3, len(token_rows)))

    def __len__(self) -> int:
        return len(self.rows_cpu)

    def piece(self, start: int, n: int) -> "ChunkTokens":
        """Tokens start .. start + n - 1."""
        end = start + n
        return ChunkTokens(self.rows_cpu[start:end], self.positions_cpu[start:end], self.packed[:, start:end])

    def kv_slots(self, req_to_token: torch.Tensor) -> torch.Tensor:
        """[n] int64 KV slot of each token (req_to_token: [max_reqs, max_context] int32)."""
        return req_to_token[self.packed[2], self.packed[1]].to(torch.int64)

    def selection(self) -> RowSelection:
        """The tokens' batch rows: one decode row per token."""
        return RowSelection(self.rows_cpu, self.packed[0])

    def decode_lengths(self) -> tuple[list[int], torch.Tensor]:
        """Each token's decode-row length (its position + 1), on the host and [n] on the device."""
        return [p + 1 for p in self.positions_cpu], self.packed[1] + 1
