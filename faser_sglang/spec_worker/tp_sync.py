"""Keeping FASER's per-step decisions identical on every tensor-parallel rank.

Under tensor parallelism every rank runs its own scheduler and FASER worker over a
shard of both models, and a sharded forward is only correct when every rank feeds
it the same token ids. FASER adds three per-step decisions to SGLang's, each made
identical here:

- **lengths** k_i: the length policy keeps per-request state, so the first rank's
  choice is broadcast over the group's CPU (gloo) group before the step is laid out;
- **draft tokens**: sampled drafts are broadcast from the first rank over the device
  group before they are verified (greedy drafts agree anyway; the broadcast makes
  agreement independent of sampling);
- **random numbers** of rejection sampling: every rank's generator is seeded with
  the same seed (``FASER_CONFIG`` ``seed``, else SGLang's ``--random-seed``, which
  all ranks share) and consumes it in the same order, and the target logits it
  reads are the all-gathered ones every rank holds.

With one rank every method is the identity and costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankAgreement:
    world_size: int
    src: int  # global rank whose decisions the others adopt
    is_src: bool = True  # this process is that rank (it alone writes the step trace)
    cpu_group: Any = None  # torch ProcessGroup (gloo) for host-side values
    device_group: Any = None  # torch ProcessGroup (NCCL on GPU) for device tensors

    @classmethod
    def single(cls) -> "RankAgreement":
        return cls(world_size=1, src=0)

    @classmethod
    def from_sglang_tp_group(cls) -> "RankAgreement":
        from sglang.srt.distributed import get_tp_group

        group = get_tp_group()
        if group.world_size == 1:
            return cls.single()
        return cls(
            group.world_size, group.first_rank, group.rank_in_group == 0, group.cpu_group, group.device_group
        )

    def lengths(self, lengths: Sequence[int]) -> list[int]:
        """The first rank's draft lengths, on every rank."""
        if self.world_size == 1:
            return list(lengths)
        t = torch.tensor(list(lengths), dtype=torch.int32)
        dist.broadcast(t, src=self.src, group=self.cpu_group)
        return t.tolist()

    def tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first rank's token tensor (same shape on every rank), in place."""
        if self.world_size > 1 and tokens.numel() > 0:
            dist.broadcast(tokens, src=self.src, group=self.device_group)
        return tokens


def shared_seed(config_seed: Optional[int], server_random_seed: Optional[int]) -> int:
    """The seed every rank's FASER generator starts from: the FASER config's, else
    SGLang's server-wide ``--random-seed`` (identical on all ranks; SGLang draws one
    at startup when the flag is absent)."""
    if config_seed is not None:
        return config_seed
    if server_random_seed is None:
        raise ValueError("FASER needs a seed shared by all ranks: set --random-seed or FASER_CONFIG seed")
    return server_random_seed
