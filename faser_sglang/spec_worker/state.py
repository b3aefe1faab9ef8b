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


class FaserDraftState(SpecInput):
    """How far each request's draft KV cache is filled.

    draft_kv_lens[i] = number of leading positions of request i whose draft-model KV
    is valid. The target's committed length is SGLang's seq_len; the draft lags it
    when the last step accepted every draft (its last draft token was never fed to
    the draft) or when the request did not draft (k_i = 0). The next draft pass feeds
    the missing committed tokens first (catch-up), so drafts always condition on the
    exact committed prefix.
    """

    def __init__(self, draft_kv_lens: Sequence[int]):
        # Not an EAGLE/NGRAM input: no SpecInputType, so SGLang's phase guards
        # (is_draft_input / is_verify_input) are False for it.
        super().__init__(spec_input_type=None)
        self.draft_kv_lens: list[int] = [int(x) for x in draft_kv_lens]

    def filter_batch(
        self,
        new_indices: torch.Tensor,
        new_indices_cpu: Optional[Sequence[int]] = None,
        has_been_filtered: bool = True,
    ) -> None:
        keep = new_indices_cpu if new_indices_cpu is not None else new_indices.tolist()
        self.draft_kv_lens = [self.draft_kv_lens[i] for i in keep]

    def merge_batch(self, other: Optional["FaserDraftState"]) -> None:
        if other is None:
            return
        self.draft_kv_lens = self.draft_kv_lens + other.draft_kv_lens
