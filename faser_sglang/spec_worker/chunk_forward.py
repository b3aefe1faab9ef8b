"""One forward over a chunk of new tokens per request, two ways.

Both FASER's verify (k_i + 1 tokens per request) and the draft's catch-up (the
committed tokens its KV is missing, then the bonus token) feed each request a run of
consecutive tokens after its cached prefix and need the model's logits for them.

- EXTEND: one SGLang EXTEND forward with per-request extend lengths. Right for long
  chunks, but SGLang runs it eagerly: on a 7B-class target on an H200 that is a
  ~22 ms floor per step, launch-bound.
- decode rows: every chunk token becomes its own DECODE row (same request-pool row,
  sequence length = its position + 1). Each attention backend stores all rows' keys
  and values before it attends, so a row sees the chunk tokens before it exactly as
  under a causal EXTEND. The forward is an ordinary decode batch of N rows, so it
  replays SGLang's decode CUDA graphs whenever N fits the captured batch sizes, and
  the logits of every row come back without a hidden-state pass. The price is that
  each row reads its request's prefix again, which only matters for long chunks on
  long contexts.

A decode forward holds at most ``--max-running-requests`` rows (SGLang sizes its decode
buffers so). Within that, ``auto`` takes decode rows when the model has decode CUDA
graphs that fit N rows and EXTEND otherwise; ``decode_rows`` takes them whenever they
fit the buffers (for tests without graphs). A caller that needs only each row's last
logits (the draft's catch-up) may let a longer chunk run as up to ``max_pieces``
decode-row forwards of consecutive tokens (``pieces``): a piece's rows see the
earlier pieces' keys and values, which their forwards stored, so the result is the
one forward's. On an H200 a 0.42B draft's eager EXTEND takes 20-45 ms whatever its
length (profiled, 2026-12-01) against ~2.5 ms per decode-row graph replay, so a
catch-up of 129-1024 tokens runs several times faster in pieces.

Worked example, rows [0, 2] with starts [10, 4] and lens [2, 1] (tokens t0 t1 | u0):
    decode rows: req_pool_index [r0, r0, r2], seq_lens [11, 12, 5], positions [10, 11, 4]
    EXTEND:      prefix_lens [10, 4], extend_lens [2, 1]
    pieces of 2: [(0, 10, 2)] then [(2, 4, 1)]; of 1: [(0, 10, 1)], [(0, 11, 1)], [(2, 4, 1)]
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

from faser_sglang.config import CHUNK_FORWARDS
from faser_sglang.spec_worker.batch_views import (
    ChunkTokens,
    RowSelection,
    decode_forward_batch,
    extend_forward_batch,
)
from faser_sglang.tensors import device_tensor


class ChunkForward:
    def __init__(self, runner, req_to_token_pool, mode: str):
        if mode not in CHUNK_FORWARDS:
            raise ValueError(f"chunk forward must be one of {CHUNK_FORWARDS}, got {mode!r}")
        self.runner = runner
        self.req_to_token_pool = req_to_token_pool
        self.mode = mode
        self.graphed = False  # whether every forward of the last ``logits`` replayed a CUDA graph

    def graph_rows(self) -> int:
        """Largest decode batch this model replays from a CUDA graph (0: none)."""
        graphs = getattr(self.runner, "decode_cuda_graph_runner", None)
        return min(int(getattr(graphs, "max_bs", 0) or 0), self.runner.max_running_requests)

    def row_limit(self) -> int:
        """Tokens one decode-row forward may hold (0: this mode never uses decode rows)."""
        if self.mode == "auto":
            return self.graph_rows()
        return self.runner.max_running_requests if self.mode == "decode_rows" else 0

    def uses_decode_rows(self, num_tokens: int, max_pieces: int = 1) -> bool:
        """Whether ``num_tokens`` run as at most ``max_pieces`` decode-row forwards."""
        return num_tokens <= self.row_limit() * max_pieces

    def forwards(self, num_tokens: int, max_pieces: int = 1) -> int:
        """Forwards that feed a chunk of ``num_tokens`` (>= 1) needing only each row's last
        logits (pieces are for ``last_only`` chunks)."""
        if not self.uses_decode_rows(num_tokens, max_pieces):
            return 1
        return -(-num_tokens // self.row_limit())

    def token_budget(self) -> Optional[int]:
        """Tokens per forward that replay from CUDA graphs when FASER picks the forward
        itself (``auto``); None: any count runs the same way."""
        if self.mode != "auto":
            return None
        return self.graph_rows() or None

    def forward_name(self, num_tokens: int) -> str:
        return "decode_rows" if self.uses_decode_rows(num_tokens) else "extend"

    def logits(
        self,
        batch: ScheduleBatch,
        rows: Sequence[int],  # [n] rows of the running batch, ascending
        starts: Sequence[int],  # [n] first new position per row (= its cached length)
        lens: Sequence[int],  # [n] new tokens per row, >= 1
        input_ids: torch.Tensor,  # [sum(lens)] int64, rows concatenated
        *,
        last_only: bool,
        max_pieces: int = 1,
        tokens: Optional[ChunkTokens] = None,  # ChunkTokens.of(batch, rows, starts, lens) if the caller has it
    ) -> torch.Tensor:
        """Logits of the fed tokens: [sum(lens), V], or [n, V] for each row's last token.
        With ``last_only``, up to ``max_pieces`` decode-row forwards may feed them."""
        total = sum(lens)
        self.graphed = True  # until a forward of this chunk runs eagerly
        if tokens is None:
            tokens = ChunkTokens.of(batch, rows, starts, lens)
        out_cache_loc = tokens.kv_slots(self.req_to_token_pool.req_to_token)  # [total]
        if last_only and self.uses_decode_rows(total, max_pieces):
            return self._last_logits_in_pieces(batch, rows, starts, lens, tokens, input_ids, out_cache_loc)
        if not last_only and self.uses_decode_rows(total):
            return self._decode_rows(batch, tokens, input_ids, out_cache_loc)
        sel = None if len(rows) == len(batch.reqs) else RowSelection.of(rows, batch.seq_lens.device)
        return self._extend(batch, sel, starts, lens, input_ids, out_cache_loc, last_only)

    def _last_logits_in_pieces(self, batch, rows, starts, lens, tokens, input_ids, out_cache_loc) -> torch.Tensor:
        """[n, V] each row's last logits, feeding the tokens in ``pieces`` of decode rows
        (one piece when they fit one forward)."""
        row_end = {row: start + n for row, start, n in zip(rows, starts, lens)}  # rows are distinct
        out: list[torch.Tensor] = []
        offset = 0
        for piece in pieces(rows, starts, lens, self.row_limit()):
            p_lens = [n for _, _, n in piece]
            n = sum(p_lens)
            logits = self._decode_rows(
                batch,
                tokens.piece(offset, n),
                input_ids[offset : offset + n],
                out_cache_loc[offset : offset + n],
            )  # [n, V]
            last = _last_token_index(p_lens)
            ends = [last[j] for j, (row, start, m) in enumerate(piece) if start + m == row_end[row]]
            if ends:
                # Indexing copies: the next piece's graph replay overwrites ``logits``.
                out.append(logits[device_tensor(ends, logits.device)])
            offset += n
        return out[0] if len(out) == 1 else torch.cat(out)

    def _decode_rows(self, batch, tokens: ChunkTokens, input_ids, out_cache_loc) -> torch.Tensor:
        """[len(tokens), V] logits of one decode row per token."""
        seq_lens_cpu, seq_lens = tokens.decode_lengths()
        fb = decode_forward_batch(
            batch,
            self.runner,
            sel=tokens.selection(),
            input_ids=input_ids,
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=out_cache_loc,
            seq_lens=seq_lens,
        )
        return self._forward(fb).next_token_logits

    def _extend(self, batch, sel, starts, lens, input_ids, out_cache_loc, last_only: bool) -> torch.Tensor:
        fb = extend_forward_batch(
            batch,
            self.runner,
            sel=sel,
            input_ids=input_ids,
            prefix_lens=starts,
            extend_lens=lens,
            out_cache_loc=out_cache_loc,
            capture_hidden_mode=CaptureHiddenMode.NULL if last_only else CaptureHiddenMode.FULL,
        )
        out = self._forward(fb)
        if last_only:
            return out.next_token_logits
        # An EXTEND forward returns logits of each row's last token only; the full
        # hidden states (captured above) give the rest through the model's own
        # logits head (vocab-parallel gather, soft-capping and vocab trim included).
        model = self.runner.model
        return model.logits_processor._get_logits(
            out.hidden_states,
            model.lm_head,
            LogitsMetadata.from_forward_batch(fb),
            use_logits_buffer=False,
        )

    def _forward(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        """One model forward; ``graphed`` stays True only while every forward of the
        chunk replayed a CUDA graph (the worker reports it to SGLang's decode log)."""
        out = self.runner.forward(fb)
        self.graphed &= out.can_run_graph
        return out.logits_output


def pieces(
    rows: Sequence[int], starts: Sequence[int], lens: Sequence[int], limit: int
) -> list[list[tuple[int, int, int]]]:
    """The chunk's tokens, in order, cut into runs of at most ``limit``: per piece its
    (row, start, n) segments. A row whose tokens straddle a cut appears in both pieces.
    rows [0, 2], starts [10, 4], lens [2, 1], limit 1 -> [[(0, 10, 1)], [(0, 11, 1)], [(2, 4, 1)]]"""
    if limit < 1:
        raise ValueError(f"pieces need a limit >= 1, got {limit}")
    out: list[list[tuple[int, int, int]]] = []
    piece: list[tuple[int, int, int]] = []
    room = limit
    for row, start, n in zip(rows, starts, lens):
        while n > 0:
            take = min(n, room)
            piece.append((row, start, take))
            start, n, room = start + take, n - take, room - take
            if room == 0:
                out.append(piece)
                piece, room = [], limit
    if piece:
        out.append(piece)
    return out


def _last_token_index(lens: Sequence[int]) -> list[int]:
    """Flat index of each row's last token: lens [2, 1, 3] -> [1, 2, 5]."""
    out, end = [], 0
    for n in lens:
        end += n
        out.append(end - 1)
    return out
