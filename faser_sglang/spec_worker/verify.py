"""Verify phase: one ragged target forward over every request's verify chunk.

Request i contributes k_i + 1 query tokens (its bonus token and its drafts) at
positions seq_len_i .. seq_len_i + k_i, attending causally to its committed prefix.
That is exactly an EXTEND forward with prefix seq_len_i and extend length k_i + 1,
which every SGLang attention backend runs natively with per-request lengths
(FlashInfer's paged prefill with a per-request qo_indptr, Triton's extend kernel, the
CPU extend kernel). The KV of all chunk tokens is written to the request's reserved
slots; only the accepted prefix becomes committed, the rest is overwritten later.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.logits_processor import LogitsMetadata
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

from faser_sglang.layout import RaggedLayout
from faser_sglang.spec_worker.batch_views import extend_forward_batch, kv_slots
from faser_sglang.spec_worker.draft import committed_tokens


class VerifyPhase:
    def __init__(self, target_runner, req_to_token_pool):
        self.runner = target_runner
        self.req_to_token_pool = req_to_token_pool

    def bonus_tokens(self, batch: ScheduleBatch) -> torch.Tensor:
        """[bs] int64: each request's last emitted token (position seq_len)."""
        seq_lens = batch.seq_lens_cpu.tolist()
        ids = []
        for req, n in zip(batch.reqs, seq_lens):
            total = len(req.origin_input_ids) + len(req.output_ids)
            if total != n + 1:
                raise RuntimeError(
                    f"FASER: request {req.rid} has {total} tokens but seq_len {n}; "
                    "expected exactly one uncommitted (bonus) token"
                )
            ids.extend(committed_tokens(req, n, n + 1))
        return torch.tensor(ids, dtype=torch.int64, device=batch.seq_lens.device)

    def run(
        self,
        batch: ScheduleBatch,
        layout: RaggedLayout,
        bonus: torch.Tensor,  # [bs] int64
        draft_tokens: torch.Tensor,  # [bs, K_max] int64
    ) -> torch.Tensor:
        """Target logits of every verify token, flat in layout order. [N, V] float."""
        chunk = torch.cat([bonus.unsqueeze(1), draft_tokens], dim=1)  # [bs, K+1]
        input_ids = layout.to_flat(chunk)  # [N]
        seq_lens = batch.seq_lens.to(torch.int64)
        verify_lens = layout.draft_lens + 1
        out_cache_loc = kv_slots(
            self.req_to_token_pool.req_to_token,
            batch.req_pool_indices,
            seq_lens,
            verify_lens,
            total=layout.num_verify_tokens,
        )
        fb = extend_forward_batch(
            batch,
            self.runner,
            sel=None,
            input_ids=input_ids,
            prefix_lens=batch.seq_lens_cpu.tolist(),
            extend_lens=layout.verify_lens_cpu,
            out_cache_loc=out_cache_loc,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        out = self.runner.forward(fb).logits_output
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
