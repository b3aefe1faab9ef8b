"""Per-request FASER state carried by SGLang's ScheduleBatch between steps.

SGLang keeps the worker's ``next_draft_input`` on the running batch as
``batch.spec_info`` and filters / merges it together with the batch's requests
(finished, retracted and newly prefilled requests), so per-request state that must
follow a request's row lives here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from sglang.srt.speculative.spec_info import SpecInput

from faser_sglang.spec_worker.draft_ahead import AheadDrafts


class FaserDraftState(SpecInput):
    """How far each request's draft KV cache is filled, at most.

    draft_kv_bound[i] = number of leading positions of request i whose draft-model KV
    was written by the last step that drafted for it. Positions the verify then
    rejected are not valid, so the valid fill is min(draft_kv_bound[i], seq_len_i)
    with the request's committed length at the next step (``draft_kv_lens``): the
    worker only learns that length there, because under SGLang's overlap schedule a
    step's acceptance reaches the host after the next step is launched. The draft
    lags the committed length when the last step accepted every draft and its last
    draft was never fed to the draft (a chain feeds every row up to the step's
    longest draft m, so only a row with k_i = m; one forward per step feeds k_i - 1),
    or when the request did not draft (k_i = 0); the next draft pass feeds the
    missing committed tokens first (catch-up), so drafts always condition on the exact
    committed prefix.

    ``ahead``: the drafts of the next step when it was drafted ahead (draft_ahead.py),
    filtered and merged with the rows.

    The remaining fields are the overlap schedule's relay (SGLang's FutureMap):
    ``bonus_tokens`` [bs] is each request's last emitted token, which the scheduler
    stashes per request-pool row; ``future_indices`` are the rows it was stashed at.
    FASER itself reads tokens from its device token history (token_history.py).
    """

    def __init__(self, draft_kv_bound: Sequence[int], bonus_tokens: Optional[torch.Tensor] = None):
        # Not an EAGLE/NGRAM input: no SpecInputType, so SGLang's phase guards
        # (is_draft_input / is_verify_input) are False for it.
        super().__init__(spec_input_type=None)
        self.draft_kv_bound: list[int] = [int(x) for x in draft_kv_bound]
        self.ahead: Optional[AheadDrafts] = None
        self.bonus_tokens = bonus_tokens
        self.future_indices: Optional[torch.Tensor] = None
        # Relay fields SGLang reads from every V2 draft input; FASER has none of them.
        self.topk_p = self.topk_index = self.hidden_states = self.draft_probs = None
        self.dsa_topk_indices = None
        self.future_dsa_topk_indices_available = False

    def draft_kv_lens(self, seq_lens: Sequence[int]) -> list[int]:
        """[bs] valid draft KV fill given the committed lengths of this step."""
        if len(seq_lens) != len(self.draft_kv_bound):
            raise RuntimeError(
                f"FASER draft state has {len(self.draft_kv_bound)} rows, the batch {len(seq_lens)}"
            )
        return [min(b, n) for b, n in zip(self.draft_kv_bound, seq_lens)]

    def filter_batch(
        self,
        new_indices: torch.Tensor,
        new_indices_cpu: Optional[Sequence[int]] = None,
        has_been_filtered: bool = True,
    ) -> None:
        keep = new_indices_cpu if new_indices_cpu is not None else new_indices.tolist()
        self.draft_kv_bound = [self.draft_kv_bound[i] for i in keep]
        if self.ahead is not None:
            self.ahead.filter(new_indices, keep)
        if self.future_indices is not None:
            self.future_indices = self.future_indices[new_indices]
        if self.bonus_tokens is not None:
            self.bonus_tokens = self.bonus_tokens[new_indices]

    def merge_batch(self, other: Optional["FaserDraftState"]) -> None:
        if other is None:
            return
        self.ahead = AheadDrafts.merged(self.ahead, len(self.draft_kv_bound), other.ahead, len(other.draft_kv_bound))
        self.draft_kv_bound = self.draft_kv_bound + other.draft_kv_bound
        self.future_indices = _cat(self.future_indices, other.future_indices)
        self.bonus_tokens = _cat(self.bonus_tokens, other.bonus_tokens)


def _cat(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if a is None and b is None:
        return None
    if a is None or b is None:
        # Under the overlap schedule both halves carry the relay; losing it would let
        # the scheduler skip resolving the merged rows' lengths.
        raise RuntimeError("FASER draft state: merging a batch with relay fields and one without")
    return torch.cat([a, b])
