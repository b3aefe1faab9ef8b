"""Verify phase: one ragged target forward over every request's verify chunk.

Request i contributes k_i + 1 query tokens (its bonus token and its drafts) at
positions seq_len_i .. seq_len_i + k_i, attending causally to its committed prefix:
an EXTEND forward with prefix seq_len_i and extend length k_i + 1, or the same
computation as N = sum(k_i + 1) decode rows replayed from CUDA graphs
(chunk_forward.py says which runs when). The KV of all chunk tokens is written to the
request's reserved slots; only the accepted prefix becomes committed, the rest is
overwritten later. With every k_i = 0 the verify is exactly a plain decode step, so
``plain_decode`` hands it to SGLang's own model worker, which also samples it with
SGLang's sampler: such a step does no verify or acceptance work of FASER's.
"""

from __future__ import annotations

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult

from faser_sglang.layout import RaggedLayout
from faser_sglang.spec_worker.batch_views import decode_forward_batch
from faser_sglang.spec_worker.chunk_forward import ChunkForward


class VerifyPhase:
    def __init__(self, chunks: ChunkForward, target_worker: TpModelWorker):
        self.chunks = chunks
        self.target_worker = target_worker

    def run(
        self,
        batch: ScheduleBatch,
        layout: RaggedLayout,
        bonus: torch.Tensor,  # [bs] int64
        draft_tokens: torch.Tensor,  # [bs, K_max] int64
    ) -> torch.Tensor:
        """Target logits of every verify token, flat in layout order. [N, V] float."""
        chunk = torch.cat([bonus.unsqueeze(1), draft_tokens], dim=1)  # [bs, K+1]
        return self.chunks.logits(
            batch,
            rows=range(layout.batch_size),
            starts=batch.seq_lens_cpu.tolist(),
            lens=layout.verify_lens_cpu,
            input_ids=layout.to_flat(chunk),
            last_only=False,
        )

    def plain_decode(
        self,
        batch: ScheduleBatch,
        bonus: torch.Tensor,  # [bs] int64
        seq_lens: list[int],  # batch.seq_lens_cpu as a list
    ) -> GenerationBatchResult:
        """A step where no request drafts: one decode row per request feeds its bonus
        token at position seq_len, through SGLang's model worker (decode CUDA graphs,
        then SGLang's sampler on the batch's sampling info). next_token_ids: [bs]."""
        pool = self.chunks.req_to_token_pool.req_to_token
        out_cache_loc = pool[batch.req_pool_indices, batch.seq_lens].to(torch.int64)  # [bs]
        fb = decode_forward_batch(
            batch,
            self.chunks.runner,
            sel=None,
            input_ids=bonus,
            seq_lens_cpu=[n + 1 for n in seq_lens],
            out_cache_loc=out_cache_loc,
        )
        return self.target_worker.forward_batch_generation(None, forward_batch=fb)
