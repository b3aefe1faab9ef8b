"""Per-request sampling transforms, identical to SGLang's own sampler.

SGLang samples a token by dividing logits by the temperature, taking the softmax,
then zeroing probabilities outside top-k, outside the top-p nucleus and below
min_p * max_prob, and drawing from what is left (``torch.multinomial`` renormalises).
Rejection sampling must compare the draft and target under exactly that transform,
so it lives here once and both phases call it. Greedy requests (top_k <= 1, which
is how SGLang stores temperature 0) take the argmax instead.

One backend detail: when any request of a batch uses min-p, SGLang's flashinfer
sampling backend applies top-k, renormalises, then applies top-p to the renormalised
distribution (``top_p_after_top_k``); otherwise, and on the pytorch backend, top-k and
top-p both judge the original distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from faser_sglang.tensors import device_tensor


def greedy_requests(reqs: Sequence) -> tuple[bool, ...]:
    """[n] whether each request is greedy: top_k <= 1, as SGLang decides it
    (``SamplingBatchInfo.is_all_greedy``)."""
    return tuple(r.sampling_params.top_k <= 1 for r in reqs)


def biased_requests(reqs: Sequence) -> tuple[bool, ...]:
    """[n] whether each request has a logit bias. SGLang keeps a batch's bias tensor
    (zero rows) until the batch empties once any request brought one, so the tensor
    alone does not say whether a row is biased."""
    return tuple(r.sampling_params.logit_bias is not None for r in reqs)


def plain_rows(sampling: SamplingRows, reqs: Sequence, rows: Sequence[int]) -> bool:
    """Whether these batch rows are all greedy and unbiased: rows a greedy chain drafts
    (the others need the sampled chains, which sample and add the logit bias)."""
    biased = biased_requests(reqs)
    return all(sampling.greedy_cpu[i] and not biased[i] for i in rows)


@dataclass(frozen=True)
class SamplingRows:
    """Sampling parameters, one row per request (or per flat token after expand).

    Which rows are greedy is also kept on the host (``greedy_cpu``), so that choosing
    rows by rule never reads a device tensor back (on a GPU, a wait for all queued work)."""

    temperatures: torch.Tensor  # [n] float32, > 0
    top_ks: torch.Tensor  # [n] int64
    top_ps: torch.Tensor  # [n] float32
    min_ps: torch.Tensor  # [n] float32
    greedy: torch.Tensor  # [n] bool
    logit_bias: Optional[torch.Tensor]  # [n, V] float32 or None
    greedy_cpu: tuple[bool, ...]  # [n] the same as ``greedy``
    top_p_after_top_k: bool = False  # top-p judges the top-k-renormalised distribution

    @classmethod
    def from_sampling_info(cls, info, sampling_backend: str, reqs: Sequence) -> "SamplingRows":
        """From SGLang's ``SamplingBatchInfo`` (temperatures is [bs, 1] there), the
        batch's requests in the same order, and the server's ``--sampling-backend``."""
        top_ks = info.top_ks.to(torch.int64)
        return cls(
            temperatures=info.temperatures.view(-1).to(torch.float32),
            top_ks=top_ks,
            top_ps=info.top_ps.to(torch.float32),
            min_ps=info.min_ps.to(torch.float32),
            greedy=top_ks <= 1,
            logit_bias=info.logit_bias,
            greedy_cpu=greedy_requests(reqs),
            top_p_after_top_k=sampling_backend == "flashinfer" and bool(info.need_min_p_sampling),
        )

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy_cpu)

    def sampled_rows(self) -> list[int]:
        """Indices of the rows that sample (not greedy)."""
        return [i for i, g in enumerate(self.greedy_cpu) if not g]

    def select(self, rows: Sequence[int], rows_t: Optional[torch.Tensor] = None) -> "SamplingRows":
        """A subset of rows, by host index; ``rows_t``: the same indices on the device,
        where the caller has them already."""
        if rows_t is None:
            rows_t = device_tensor(rows, self.greedy.device)
        return self._take(rows_t, tuple(self.greedy_cpu[r] for r in rows))

    def per_slot(self, slots: int) -> "SamplingRows":
        """Every row repeated ``slots`` times (one row per verify slot)."""
        return self._take(
            torch.arange(len(self.greedy_cpu), device=self.greedy.device).repeat_interleave(slots),
            tuple(g for g in self.greedy_cpu for _ in range(slots)),
        )

    def _take(self, rows: torch.Tensor, greedy_cpu: tuple[bool, ...]) -> "SamplingRows":
        return SamplingRows(
            temperatures=self.temperatures[rows],
            top_ks=self.top_ks[rows],
            top_ps=self.top_ps[rows],
            min_ps=self.min_ps[rows],
            greedy=self.greedy[rows],
            logit_bias=None if self.logit_bias is None else self.logit_bias[rows],
            greedy_cpu=greedy_cpu,
            top_p_after_top_k=self.top_p_after_top_k,
        )


def biased(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """Logits with the per-request logit_bias added (a new tensor when biased)."""
    if rows.logit_bias is None:
        return logits
    return logits + rows.logit_bias[:, : logits.shape[-1]]


def greedy_tokens(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """[n, V] -> [n] int64 argmax, as SGLang's greedy path."""
    return torch.argmax(biased(logits, rows), dim=-1)


def sampling_probs(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """[n, V] logits -> [n, V] float32 normalised distribution SGLang samples from."""
    return transformed_probs(
        biased(logits.to(torch.float32), rows),
        rows.temperatures,
        rows.top_ks,
        rows.top_ps,
        rows.min_ps,
        rows.top_p_after_top_k,
    )


def transformed_probs(
    logits: torch.Tensor,  # [n, V] float32, biased
    temperatures: torch.Tensor,  # [n] float32, > 0
    top_ks: torch.Tensor,  # [n] int64
    top_ps: torch.Tensor,  # [n] float32
    min_ps: torch.Tensor,  # [n] float32
    top_p_after_top_k: Union[bool, torch.Tensor],  # for the batch, or [n] bool per row
) -> torch.Tensor:
    """[n, V] float32: SGLang's sampling transform (module docstring), normalised. With
    a per-row ``top_p_after_top_k`` it runs without host decisions (CUDA graphs)."""
    probs = torch.softmax(logits / temperatures.unsqueeze(1), dim=-1)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)  # [n, V]
    cum = torch.cumsum(probs_sort, dim=-1)
    rank = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)  # [1, V]
    drop = rank >= top_ks.unsqueeze(1)
    top_p = top_ps.unsqueeze(1)  # [n, 1]
    if isinstance(top_p_after_top_k, torch.Tensor) or top_p_after_top_k:
        # Mass before a token <= top_p x the top-k mass: top-p on the renormalised top-k.
        last = (top_ks.clamp(max=probs.shape[-1]) - 1).clamp(min=0).unsqueeze(1)  # [n, 1]
        scaled = top_p * cum.gather(1, last)
        if isinstance(top_p_after_top_k, torch.Tensor):
            scaled = torch.where(top_p_after_top_k.unsqueeze(1), scaled, top_p)
        top_p = scaled
    drop |= (cum - probs_sort) > top_p
    drop |= probs_sort < (probs_sort[:, :1] * min_ps.unsqueeze(1))
    probs_sort = probs_sort.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(1, probs_idx, probs_sort)
    return out / out.sum(dim=-1, keepdim=True)


def draw(q: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """[n, V] distribution, [n] float64 uniform draws in [0, 1) -> [n] int64 tokens, each
    the token whose interval of q's cumulative distribution holds its draw: a sample
    from q (a token of zero mass has an empty interval) that reads nothing back to the
    host, so that CUDA graphs can hold it. Cumulated in float64: a float32 sum near 1
    would give a token of mass below 6e-8 no interval at all."""
    cdf = torch.cumsum(q.to(torch.float64), dim=-1)  # [n, V]
    total = cdf[:, -1:]
    point = torch.minimum(uniform.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))  # < total
    # A NaN distribution would point past the vocabulary; a token id must stay in it.
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_(max=q.shape[-1] - 1)
