"""Every request's token ids on the device, by request-pool row and position.

The bonus token a step verifies and the committed tokens a draft catch-up feeds are
read from here instead of ``req.output_ids``. Under SGLang's overlap schedule the
scheduler processes a step's results only after it has launched the next step, so
when step N+1 runs, the host does not yet know what step N emitted; the device does,
because every step writes what it emitted here before the next one reads it (same
stream). Synchronous serving reads the same buffer, so both schedules take one path.

Layout: ``ids[row, p]`` = token id at position p of the request in request-pool row
``row`` (SGLang's ``req_pool_indices``), the twin of SGLang's ``req_to_token`` (which
maps the same (row, p) to a KV slot), widened by K_max + 1 columns because a step
writes its whole verify chunk. Positions past a request's committed length hold
tokens a verify did not accept; the step that commits such a position writes it
again first, so reads (committed positions and the bonus) always see the right id.

Writes: a prefill writes the prompt (and the output a retracted request already
had) from the host and the sampled first token at its position; a decode step
writes row i's emitted tokens at positions seq_len_i + 1 .. seq_len_i + K_max + 1,
the first accept_len_i of them committed.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch

from faser_sglang.spec_worker.batch_views import ChunkTokens
from faser_sglang.tensors import device_tensor


class TokenHistory:
    def __init__(self, req_to_token: torch.Tensor, k_max: int):
        rows, width = req_to_token.shape
        self.width = width + k_max + 1
        self.ids = torch.zeros((rows, self.width), dtype=torch.int32, device=req_to_token.device)

    def write_prefill(self, batch: ScheduleBatch, first_tokens: torch.Tensor) -> None:
        """A prefill batch: each request's tokens so far (its fill ids: the prompt, then
        the output a retracted request carries) from the host, and ``first_tokens``
        ([bs], sampled by the prefill; next step's bonus) at position seq_len. (A chunk
        of a longer prompt writes its discarded sample over the next chunk's first
        position, which the next chunk's prefill writes again.)"""
        device = self.ids.device
        fills = [req.get_fill_ids() for req in batch.reqs]
        total = sum(len(f) for f in fills)
        if total:
            # One host-to-device copy of every fill id; rows and positions are expanded
            # on the device (output_size given, so repeat_interleave does not sync).
            values = torch.tensor(list(itertools.chain.from_iterable(fills)), dtype=torch.int32)
            lens = device_tensor([len(f) for f in fills], device)  # [n]
            firsts = torch.cumsum(lens, 0) - lens  # [n] flat index of each request's position 0
            flat = torch.arange(total, device=device)  # [total]
            positions = flat - torch.repeat_interleave(firsts, lens, output_size=total)
            rows = torch.repeat_interleave(batch.req_pool_indices, lens, output_size=total)  # [total]
            self.ids[rows, positions] = values.to(device, non_blocking=True)
        self.ids[batch.req_pool_indices, batch.seq_lens] = first_tokens.to(torch.int32)

    def write_step(
        self,
        pool_rows: torch.Tensor,  # [bs] int64
        seq_lens: torch.Tensor,  # [bs] int64 committed lengths before the step
        tokens: torch.Tensor,  # [bs, W] emitted tokens of each row, its accepted prefix first
    ) -> None:
        """A decode step: row i's tokens at positions seq_len_i + 1 .. seq_len_i + W."""
        width = tokens.shape[1]
        positions = seq_lens.unsqueeze(1) + 1 + torch.arange(width, device=seq_lens.device)  # [bs, W]
        self.ids[pool_rows.unsqueeze(1).expand(-1, width), positions] = tokens.to(torch.int32)

    def bonus(self, batch: ScheduleBatch) -> torch.Tensor:
        """[bs] int64: each request's last emitted token (position seq_len)."""
        return self.ids[batch.req_pool_indices, batch.seq_lens].to(torch.int64)

    def gather(self, pool_rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """[n] int64: the tokens at (pool_rows[j], positions[j])."""
        index = device_tensor([*pool_rows, *positions], self.ids.device).view(2, len(pool_rows))  # one copy
        return self.read(index[0], index[1])

    def read(self, pool_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """int64 tokens at (pool_rows, positions), device index tensors broadcast
        together: positions the host need not know."""
        return self.ids[pool_rows, positions].to(torch.int64)

    def at(self, tokens: ChunkTokens) -> torch.Tensor:
        """[len(tokens)] int64: the tokens of a chunk, from its device indices."""
        return self.ids[tokens.packed[2], tokens.packed[1]].to(torch.int64)
