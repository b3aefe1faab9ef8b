"""The ragged batch layout of one FASER decode step.

Terms used everywhere in this package:
- *draft length* k_i: how many draft tokens request i proposes this step, 0..K_max.
- *bonus token*: the last token a request emitted; it has no KV yet and opens the
  request's verify chunk.
- *verify chunk*: the k_i + 1 query tokens of request i in the target forward
  (bonus token, then its k_i drafts).
- *accepted*: drafts the target agrees with (a prefix of the chunk); the step emits
  the accepted drafts plus one *correction* token (a resample on rejection, or the
  target's next token when every draft was accepted).

Every phase (draft, verify, accept) reads the same layout, so it lives in this
shared module and not in any phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class RaggedLayout:
    """Index maps for per-request verify chunks.

    Worked example, K_max = 2 and draft lengths k = [2, 0, 1]:
        verify_lens  = [3, 1, 2]                 (k_i + 1)
        flat tokens  = [a0 a1 a2 | b0 | c0 c1]   (a0, b0, c0 are bonus tokens)
        pad_index    = [[0, 1, 2],
                        [3, 3, 3],
                        [4, 5, 5]]               (flat row for padded [bs, K_max+1])
        flat_index   = [0, 1, 2, 3, 6, 7]        (padded slot, row-major, of each flat row)
    Padded slots repeat the chunk's last row so gathers stay in bounds.

    Every map is built on the host, where the lengths are, and reaches the device in
    one non-blocking copy; moving between the layouts is a gather by index, never a
    boolean mask, whose size the host would have to wait for.
    """

    draft_lens_cpu: tuple[int, ...]
    draft_lens: torch.Tensor  # [bs] int64
    verify_lens_cpu: tuple[int, ...]
    pad_index: torch.Tensor  # [bs, K_max + 1] int64, rows of the flat token axis
    flat_index: torch.Tensor  # [num_verify_tokens] int64, slots of the padded axis
    max_draft_len: int  # K_max

    @classmethod
    def build(
        cls, draft_lens: Sequence[int], max_draft_len: int, device: torch.device | str
    ) -> "RaggedLayout":
        lens = tuple(int(k) for k in draft_lens)
        if any(k < 0 or k > max_draft_len for k in lens):
            raise ValueError(f"draft lengths {lens} outside [0, {max_draft_len}]")
        verify = tuple(k + 1 for k in lens)
        bs, width = len(lens), max_draft_len + 1
        verify_t = torch.tensor(verify, dtype=torch.int64)  # [bs]
        cols = torch.arange(width, dtype=torch.int64)  # [K+1]
        starts = torch.cumsum(verify_t, 0) - verify_t  # [bs] first flat row per request
        pad_index = starts.unsqueeze(1) + torch.minimum(cols.unsqueeze(0), (verify_t - 1).unsqueeze(1))
        flat_index = torch.tensor([i * width + j for i, n in enumerate(verify) for j in range(n)], dtype=torch.int64)
        packed = torch.cat([verify_t - 1, pad_index.reshape(-1), flat_index]).to(device, non_blocking=True)
        draft_lens_t, pad_flat, flat_t = packed.split([bs, bs * width, flat_index.numel()])
        return cls(
            draft_lens_cpu=lens,
            draft_lens=draft_lens_t,
            verify_lens_cpu=verify,
            pad_index=pad_flat.view(bs, width),
            flat_index=flat_t,
            max_draft_len=max_draft_len,
        )

    @property
    def batch_size(self) -> int:
        return len(self.draft_lens_cpu)

    @property
    def num_verify_tokens(self) -> int:
        return sum(self.verify_lens_cpu)

    def to_padded(self, flat: torch.Tensor) -> torch.Tensor:
        """[num_verify_tokens, ...] -> [bs, K_max + 1, ...] (padded slots repeat)."""
        return flat[self.pad_index]

    def to_flat(self, padded: torch.Tensor) -> torch.Tensor:
        """[bs, K_max + 1, ...] -> [num_verify_tokens, ...] (drops padded slots)."""
        return padded.flatten(0, 1).index_select(0, self.flat_index)

    def verify_positions(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Absolute positions of the flat verify tokens: seq_len_i + 0..k_i. [N] int64.

        seq_lens = [10, 4, 7] with the example above -> [10 11 12 | 4 | 7 8].
        """
        cols = torch.arange(self.max_draft_len + 1, dtype=torch.int64, device=seq_lens.device)
        padded = seq_lens.to(torch.int64).unsqueeze(1) + cols.unsqueeze(0)  # [bs, K+1]
        return self.to_flat(padded)
