"""Statistical losslessness: sampled FASER tokens follow the target distribution.

For a small vocabulary, draw many (draft, accept) rounds from fixed p and q and
compare the empirical distribution of the first emitted token (and of the token
after an accepted draft) with p by a chi-square test. A deliberately broken
acceptance rule (always accept the draft) must fail the same test.
"""

import numpy as np
import torch
from scipy.stats import chisquare

from conftest import multinomial_chisquare_pvalue

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
        greedy_cpu=(False, False, False),
    )
    probs = sampling_probs(logits, rows)
    assert torch.allclose(probs[0], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)
    assert torch.allclose(probs[1], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)
    assert torch.allclose(probs[2], torch.tensor([0.35, 0.25, 0, 0, 0, 0]) / 0.60, atol=1e-6)


def test_temperature_sharpens():
    logits = torch.log(P).unsqueeze(0)
    cold = SamplingRows(torch.tensor([0.5]), torch.tensor([V]), torch.ones(1), torch.zeros(1),
                        torch.zeros(1, dtype=torch.bool), None, (False,))
    expected = P**2 / (P**2).sum()
    assert torch.allclose(sampling_probs(logits, cold)[0], expected, atol=1e-6)


def _flashinfer_sequential(probs: torch.Tensor, k: int, p: float, min_p: float) -> torch.Tensor:
    """SGLang's flashinfer sampling backend when a batch needs min-p: top_k_renorm_prob,
    then top_p_renorm_prob on the renormalised result, then min-p; written out plainly."""
    out = torch.zeros_like(probs)
    order = torch.argsort(probs, descending=True)[:k]
    out[order] = probs[order] / probs[order].sum()  # top-k, renormalised
    kept, cum = [], 0.0
    for i in torch.argsort(out, descending=True).tolist():
        if out[i] == 0 or cum > p:
            break
        kept.append(i)  # a token stays while the mass before it is <= top_p
        cum += float(out[i])
    nucleus = torch.zeros_like(out)
    nucleus[kept] = out[kept] / out[kept].sum()
    nucleus[nucleus < nucleus.max() * min_p] = 0.0
    return nucleus / nucleus.sum()


def test_top_p_after_top_k_matches_the_flashinfer_backend_with_min_p():
    """With min-p anywhere in a batch, SGLang's flashinfer backend applies top-p to the
    top-k-renormalised distribution (stricter than the joint rule): [.5, .3, .2] with
    top_k 2 and top_p 0.6 keeps {0, 1} jointly but {0} in sequence."""
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0]]).clamp(min=1e-12)
    rows = SamplingRows(torch.ones(1), torch.tensor([2]), torch.tensor([0.6]), torch.zeros(1),
                        torch.zeros(1, dtype=torch.bool), None, (False,))  # fmt: skip
    joint = sampling_probs(torch.log(probs), rows)[0]
    sequential = sampling_probs(torch.log(probs), SamplingRows(**{**rows.__dict__, "top_p_after_top_k": True}))[0]
    assert torch.count_nonzero(joint) == 2 and torch.count_nonzero(sequential) == 1
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(1, 40, generator=g) * 2
        k = int(torch.randint(1, 41, (1,), generator=g))
        p, min_p = float(torch.rand(1, generator=g)) * 0.9 + 0.05, float(torch.rand(1, generator=g)) * 0.3
        rows = SamplingRows(torch.ones(1), torch.tensor([k]), torch.tensor([p]), torch.tensor([min_p]),
                            torch.zeros(1, dtype=torch.bool), None, (False,), top_p_after_top_k=True)  # fmt: skip
        expected = _flashinfer_sequential(torch.softmax(logits[0], -1), k, p, min_p)
        assert torch.allclose(sampling_probs(logits, rows)[0], expected, atol=1e-5)


def test_server_chi_square_pools_the_tail_and_keeps_its_level():
    """The server tests' check: 400 tokens over a marginal whose tail spreads 5% of the
    mass over 300 cells expected 1e-5 to 0.2 times each. The chi-square law on the raw
    cells rejects the null far more often than its level (any hit on a cell expected
    0.001 times reads as p ~ 0); pooled and sampled, the p-values keep the level, and a
    bulk shifted by 0.15 still reads p < 1e-3."""
    rng = np.random.default_rng(7)
    tail = np.logspace(0, -4, 300)
    probs = np.concatenate([[0.4, 0.3, 0.25], 0.05 * tail / tail.sum()])
    raw = [chisquare(rng.multinomial(400, probs), probs * 400).pvalue for _ in range(100)]
    assert sum(p < 1e-3 for p in raw) >= 5
    pooled = [multinomial_chisquare_pvalue(rng.multinomial(400, probs), probs, draws=2000) for _ in range(100)]
    assert sum(p < 1e-2 for p in pooled) <= 5
    shifted = np.concatenate([[0.55, 0.15], probs[2:]])
    assert all(multinomial_chisquare_pvalue(rng.multinomial(400, shifted), probs) < 1e-3 for _ in range(5))
