"""What a sampled draft chain (draft_chain.py) draws its tokens with.

A chain's forwards run without a host decision between them, as one CUDA graph where
graphs run, so its sampling can neither choose rows on the host nor make a random draw
in the graph (a replay would repeat the captured draw). Before a chain runs, its rows'
sampling parameters are copied into tensors the graph reads, and one uniform number per
row and forward is drawn outside it. Forward j of row r then applies SGLang's sampling
transform to its logits (sampling.transformed_probs), keeps that distribution q as
``probs[r, j]`` for the verify's rejection sampling, and takes the token whose interval
of q's cumulative distribution holds ``uniform[r, j]`` (sampling.draw): a sample from
q. A greedy row takes the argmax. A request's logit bias is added to every forward's
logits first, as SGLang's sampler adds it (greedy rows too), so a biased batch chains
through this state even when every row is greedy.
"""

from __future__ import annotations

from typing import Optional

import torch

from faser_sglang.spec_worker.sampling import SamplingRows, draw, transformed_probs


class ChainSampling:
    """Per-row sampling state of up to ``rows`` chain rows over ``forwards`` forwards."""

    def __init__(self, rows: int, forwards: int, vocab: int, device) -> None:
        # Padding rows of a graph replay read what is here: values the transform accepts.
        self.temperatures = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_ks = torch.full((rows,), vocab, dtype=torch.int64, device=device)
        self.top_ps = torch.ones(rows, dtype=torch.float32, device=device)
        self.min_ps = torch.zeros(rows, dtype=torch.float32, device=device)
        self.greedy = torch.zeros(rows, dtype=torch.bool, device=device)
        self.top_p_after_top_k = torch.zeros(rows, dtype=torch.bool, device=device)
        self.bias = torch.zeros((rows, vocab), dtype=torch.float32, device=device)  # [rows, V] logit bias
        self._biased = 0  # leading rows whose bias may be non-zero
        self.uniform = torch.zeros((rows, forwards), dtype=torch.float64, device=device)  # [rows, M]
        self.probs = torch.zeros((rows, forwards, vocab), dtype=torch.float32, device=device)  # [rows, M, V] q

    @property
    def rows(self) -> int:
        return self.greedy.shape[0]

    def load(self, rows: SamplingRows, generator: Optional[torch.Generator]) -> None:
        """Take the first len(rows) rows' parameters, and draw their uniforms."""
        n = len(rows.greedy_cpu)
        if n > self.rows:
            raise ValueError(f"{n} chain rows, sampling state for {self.rows}")
        for mine, theirs in (
            (self.temperatures, rows.temperatures),
            (self.top_ks, rows.top_ks),
            (self.top_ps, rows.top_ps),
            (self.min_ps, rows.min_ps),
            (self.greedy, rows.greedy),
        ):
            mine[:n].copy_(theirs)
        self.top_p_after_top_k[:n] = rows.top_p_after_top_k
        if rows.logit_bias is not None:
            self.bias[:n].copy_(rows.logit_bias[:, : self.bias.shape[1]])
            self._biased = max(self._biased, n)
        elif self._biased:  # an earlier batch's bias would otherwise stay in these rows
            self.bias[: self._biased].zero_()
            self._biased = 0
        self.uniform[:n].uniform_(generator=generator)

    def draw(self, logits: torch.Tensor, forward: int) -> torch.Tensor:
        """[bs, V] logits of chain forward ``forward`` -> [bs] int64 tokens; keeps their
        distributions in ``probs[:bs, forward]``."""
        bs = logits.shape[0]
        logits = logits.to(torch.float32) + self.bias[:bs]
        q = transformed_probs(
            logits,
            self.temperatures[:bs],
            self.top_ks[:bs],
            self.top_ps[:bs],
            self.min_ps[:bs],
            self.top_p_after_top_k[:bs],
        )  # [bs, V]
        self.probs[:bs, forward].copy_(q)
        sampled = draw(q, self.uniform[:bs, forward])
        return torch.where(self.greedy[:bs], torch.argmax(logits, dim=-1), sampled)
