"""Acceptance of ragged draft chains: greedy and lossless rejection sampling.

Inputs are padded to [bs, K_max] (drafts) and [bs, K_max + 1] (target rows); a
request's real length is its draft length k_i, slots past it are ignored.

Greedy: draft j is accepted while it equals the target argmax at j; the correction
token is the target argmax at the first mismatch (or at k_i when all match). Since
accepted drafts equal the argmax, the emitted row is simply argmax[0 .. a_i].

Sampled (Leviathan et al. / Chen et al.): draft d_j ~ q_j is accepted with
probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the correction is
drawn from normalise(max(p_j - q_j, 0)); when all k_i drafts pass it is drawn from
p_{k_i}. The emitted tokens are then distributed exactly as sampling from p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from faser_sglang.spec_worker.sampling import SamplingRows, greedy_tokens, sampling_probs
from faser_sglang.tensors import device_tensor


@dataclass(frozen=True)
class AcceptResult:
    tokens: torch.Tensor  # [bs, K_max + 1] int64: accepted drafts, correction, then padding
    accept_lens: torch.Tensor  # [bs] int64: accepted drafts + 1 (tokens emitted)


def _accepted_prefix(ok: torch.Tensor) -> torch.Tensor:
    """[bs, K] bool per-draft verdicts -> [bs] int64 length of the leading run of True."""
    return torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)


def _valid(draft_lens: torch.Tensor, k_max: int) -> torch.Tensor:
    cols = torch.arange(k_max, device=draft_lens.device)
    return cols.unsqueeze(0) < draft_lens.unsqueeze(1)  # [bs, K]


def accept_greedy(
    target_argmax: torch.Tensor,  # [bs, K+1] int64
    draft_tokens: torch.Tensor,  # [bs, K] int64
    draft_lens: torch.Tensor,  # [bs] int64
) -> AcceptResult:
    k_max = draft_tokens.shape[1]
    ok = (draft_tokens == target_argmax[:, :k_max]) & _valid(draft_lens, k_max)
    num_accepted = _accepted_prefix(ok)
    return AcceptResult(tokens=target_argmax.clone(), accept_lens=num_accepted + 1)


def accept_sampled(
    target_probs: torch.Tensor,  # [bs, K+1, V] float32, normalised
    draft_probs: torch.Tensor,  # [bs, K, V] float32, the q each draft was drawn from
    draft_tokens: torch.Tensor,  # [bs, K] int64
    draft_lens: torch.Tensor,  # [bs] int64
    generator: Optional[torch.Generator] = None,
) -> AcceptResult:
    bs, k_max = draft_tokens.shape
    rows = torch.arange(bs, device=draft_tokens.device)
    if k_max > 0:
        p_d = target_probs[:, :k_max].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # [bs, K]
        q_d = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # [bs, K]
        u = torch.rand(
            (bs, k_max), device=draft_tokens.device, dtype=torch.float32, generator=generator
        )
        # u < p/q written without the division: q_d > 0 for a sampled draft.
        ok = (u * q_d < p_d) & _valid(draft_lens, k_max)
        num_accepted = _accepted_prefix(ok)  # [bs]
    else:
        num_accepted = torch.zeros(bs, dtype=torch.int64, device=draft_tokens.device)

    p_a = target_probs[rows, num_accepted]  # [bs, V]
    rejected = num_accepted < draft_lens  # [bs]
    if k_max > 0:
        q_a = draft_probs[rows, num_accepted.clamp(max=k_max - 1)]  # [bs, V]
        residual = (p_a - q_a).clamp(min=0.0)
        mass = residual.sum(dim=1, keepdim=True)
        # mass == 0 means p == q at this slot, where rejection has probability 0;
        # fall back to p so a float round-off never divides by zero.
        use_residual = rejected.unsqueeze(1) & (mass > 0)
        dist = torch.where(use_residual, residual / mass.clamp(min=1e-30), p_a)
    else:
        dist = p_a
    correction = torch.multinomial(dist, 1, generator=generator).squeeze(1)  # [bs]

    tokens = torch.zeros((bs, k_max + 1), dtype=torch.int64, device=draft_tokens.device)
    tokens[:, :k_max] = draft_tokens
    tokens[rows, num_accepted] = correction
    return AcceptResult(tokens=tokens, accept_lens=num_accepted + 1)


def accept(
    target_logits: torch.Tensor,  # [bs, K+1, V] padded target logits
    draft_tokens: torch.Tensor,  # [bs, K] int64
    draft_probs: Optional[torch.Tensor],  # [bs, K, V] q, None when every row is greedy
    draft_lens: torch.Tensor,  # [bs] int64
    sampling: SamplingRows,
    generator: Optional[torch.Generator] = None,
) -> AcceptResult:
    """Accept a batch that mixes greedy and sampled requests, each by its own rule."""
    bs, kp1, vocab = target_logits.shape
    flat = target_logits.reshape(bs * kp1, vocab)
    argmax = greedy_tokens(flat, sampling.per_slot(kp1))
    greedy = accept_greedy(argmax.view(bs, kp1), draft_tokens, draft_lens)
    if sampling.all_greedy:
        return greedy
    sampled_cpu = sampling.sampled_rows()
    sampled_rows = device_tensor(sampled_cpu, target_logits.device)  # [m]
    rows = sampling.select(sampled_cpu, sampled_rows)
    m = len(sampled_cpu)
    per_slot = rows.per_slot(kp1)
    p = sampling_probs(target_logits[sampled_rows].reshape(m * kp1, vocab), per_slot)
    sampled = accept_sampled(
        p.view(m, kp1, vocab),
        draft_probs[sampled_rows],
        draft_tokens[sampled_rows],
        draft_lens[sampled_rows],
        generator,
    )
    tokens = greedy.tokens.clone()
    accept_lens = greedy.accept_lens.clone()
    tokens[sampled_rows] = sampled.tokens
    accept_lens[sampled_rows] = sampled.accept_lens
    return AcceptResult(tokens=tokens, accept_lens=accept_lens)
