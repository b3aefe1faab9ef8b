"""Statistical losslessness: sampled FASER tokens follow the target distribution.

For a small vocabulary, draw many (draft, accept) rounds from fixed p and q and
compare the empirical distribution of the first emitted token (and of the token
after an accepted draft) with p by a chi-square test. A deliberately broken
acceptance rule (always accept the draft) must fail the same test.
"""

import torch
from scipy.stats import chisquare

from faser_sglang.spec_worker.accept import AcceptResult, accept_sampled
from faser_sglang.spec_worker.sampling import SamplingRows, sampling_probs

V = 6
N = 40_000


def _draws(p: torch.Tensor, q: torch.Tensor, k: int, accept_fn, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    target = p.expand(N, k + 1, V).contiguous()
    draft_q = q.expand(N, k, V).contiguous()
    drafts = torch.multinomial(draft_q.reshape(-1, V), 1, generator=g).view(N, k)
    res: AcceptResult = accept_fn(target, draft_q, drafts, torch.full((N,), k), g)
    return res.tokens[:, 0]


def _p_value(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=V).double()
    return float(chisquare(counts.numpy(), (p.double() * N).numpy()).pvalue)


def _always_accept(target, draft_q, drafts, lens, g) -> AcceptResult:
    n, k = drafts.shape
    tokens = torch.zeros(n, k + 1, dtype=torch.int64)
    tokens[:, :k] = drafts
    return AcceptResult(tokens=tokens, accept_lens=lens + 1)


P = torch.tensor([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
Q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])


def test_first_token_follows_target():
    assert _p_value(_draws(P, Q, 3, accept_sampled, seed=1), P) > 1e-3


def test_broken_acceptance_is_detected():
    assert _p_value(_draws(P, Q, 3, _always_accept, seed=2), P) < 1e-6


def test_second_token_follows_target_given_first_accepted():
    # With p identical at every slot, the second emitted token (when the first
    # draft was accepted) must also follow p.
    g = torch.Generator().manual_seed(3)
    k = 2
    target = P.expand(N, k + 1, V).contiguous()
    draft_q = Q.expand(N, k, V).contiguous()
    drafts = torch.multinomial(draft_q.reshape(-1, V), 1, generator=g).view(N, k)
    res = accept_sampled(target, draft_q, drafts, torch.full((N,), k), g)
    second = res.tokens[res.accept_lens >= 2, 1]
    counts = torch.bincount(second, minlength=V).double()
    expected = P.double() * counts.sum()
    assert float(chisquare(counts.numpy(), expected.numpy()).pvalue) > 1e-3


def test_sampling_probs_matches_top_k_top_p_min_p():
    logits = torch.log(P).unsqueeze(0).repeat(3, 1)
    rows = SamplingRows(
        temperatures=torch.ones(3),
        top_ks=torch.tensor([2, V, V]),
        top_ps=torch.tensor([1.0, 0.55, 1.0]),  # keeps a token while the mass before it <= top_p
        min_ps=torch.tensor([0.0, 0.0, 0.5]),
        greedy=torch.zeros(3, dtype=torch.bool),
        logit_bias=None,
        all_greedy=False,
    )
    probs = sampling_probs(logits, rows)
    assert torch.allclose(probs[0], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)
    assert torch.allclose(probs[1], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)
    assert torch.allclose(probs[2], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)


def test_temperature_sharpens():
    logits = torch.log(P).unsqueeze(0)
    cold = SamplingRows(torch.tensor([0.5]), torch.tensor([V]), torch.ones(1), torch.zeros(1),
                        torch.zeros(1, dtype=torch.bool), None, False)
    expected = P**2 / (P**2).sum()
    assert torch.allclose(sampling_probs(logits, cold)[0], expected, atol=1e-6)
