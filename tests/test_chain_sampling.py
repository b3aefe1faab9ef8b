"""A sampled chain's draws: from the q it keeps, by SGLang's transform, greedy rows argmax.

The end-to-end checks (the tiny target as its own draft accepts every sampled chain
draft; chain drafts follow the target's marginals) are in test_e2e_faser.py.
"""

import pytest
import torch
from scipy.stats import chisquare

from faser_sglang.spec_worker.chain_sampling import ChainSampling
from faser_sglang.spec_worker.sampling import SamplingRows, draw, sampling_probs, transformed_probs

V = 7


def _rows(n: int, g: torch.Generator, *, greedy=None, bias=None, after=False) -> SamplingRows:
    greedy = [False] * n if greedy is None else greedy
    return SamplingRows(
        temperatures=torch.rand(n, generator=g) + 0.3,
        top_ks=torch.randint(1, V + 3, (n,), generator=g),
        top_ps=torch.rand(n, generator=g) * 0.8 + 0.2,
        min_ps=torch.rand(n, generator=g) * 0.2,
        greedy=torch.tensor(greedy),
        logit_bias=bias,
        greedy_cpu=tuple(greedy),
        top_p_after_top_k=after,
    )


def test_draw_follows_q_and_never_picks_a_zero_mass_token():
    q = torch.tensor([[0.3, 0.0, 0.45, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    n = 20_000
    tokens = draw(q.repeat_interleave(n, 0), torch.rand(2 * n, dtype=torch.float64, generator=g)).view(2, n)
    counts = torch.bincount(tokens[0], minlength=5).double()
    assert counts[1] == 0 and counts[3] == 0
    assert chisquare(counts[[0, 2, 4]].numpy(), (q[0, [0, 2, 4]].double() * n).numpy()).pvalue > 1e-3
    assert torch.all(tokens[1] == 4)
    # A draw at either end of [0, 1) stays inside the support.
    ends = torch.tensor([0.0, 1.0 - 2**-53], dtype=torch.float64)
    assert draw(q[:1].expand(2, -1), ends).tolist() == [0, 4]


def test_per_row_top_p_after_top_k_matches_the_batch_rule_row_by_row():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, V, generator=g) * 2
    rows = _rows(6, g)
    after = torch.tensor([True, False, True, True, False, False])
    mixed = transformed_probs(logits, rows.temperatures, rows.top_ks, rows.top_ps, rows.min_ps, after)
    for flag in (False, True):
        whole = sampling_probs(logits, SamplingRows(**{**rows.__dict__, "top_p_after_top_k": flag}))
        assert torch.equal(mixed[after == flag], whole[after == flag])


def test_chain_sampling_keeps_q_and_draws_from_it():
    g = torch.Generator().manual_seed(2)
    state = ChainSampling(rows=8, forwards=3, vocab=V, device="cpu")
    rows = _rows(5, g, greedy=[False, True, False, False, True], after=True)
    state.load(rows, g)
    logits = torch.randn(5, V, generator=g)
    tokens = state.draw(logits, forward=1)
    q = sampling_probs(logits, rows)
    assert torch.allclose(state.probs[:5, 1], q)
    assert torch.equal(tokens[rows.greedy], torch.argmax(logits[rows.greedy], dim=-1))
    sampled = ~rows.greedy
    assert torch.equal(tokens[sampled], draw(q[sampled], state.uniform[:5, 1][sampled]))
    assert torch.all(q[sampled].gather(1, tokens[sampled].unsqueeze(1)) > 0)
    # Rows past the loaded ones (a graph replay's padding) transform without NaNs.
    padded = state.draw(torch.randn(8, V, generator=g), forward=0)
    assert not torch.isnan(state.probs[:8, 0]).any() and padded.shape == (8,)


def test_chain_sampling_draws_follow_q_over_many_loads():
    g = torch.Generator().manual_seed(3)
    state = ChainSampling(rows=1, forwards=1, vocab=V, device="cpu")
    rows = SamplingRows(torch.ones(1), torch.tensor([V - 1]), torch.tensor([0.97]), torch.zeros(1),
                        torch.zeros(1, dtype=torch.bool), None, (False,))  # fmt: skip
    logits = torch.randn(1, V, generator=g)
    counts = torch.zeros(V, dtype=torch.float64)
    n = 4000
    for _ in range(n):
        state.load(rows, g)
        counts[state.draw(logits, forward=0)] += 1
    q = sampling_probs(logits, rows)[0].double()
    support = q > 0
    assert int(support.sum()) >= 4
    assert counts[~support].sum() == 0
    assert chisquare(counts[support].numpy(), (q[support] * n).numpy()).pvalue > 1e-3


def test_chain_sampling_refuses_too_many_rows():
    g = torch.Generator().manual_seed(4)
    state = ChainSampling(rows=2, forwards=2, vocab=V, device="cpu")
    with pytest.raises(ValueError, match="3 chain rows"):
        state.load(_rows(3, g), g)


def test_a_logit_bias_is_added_before_every_draw_and_cleared_after():
    """Greedy rows take the argmax of the biased logits, sampling rows draw from the
    transform of them, as SGLang's sampler; a later unbiased batch sees no old bias."""
    g = torch.Generator().manual_seed(5)
    state = ChainSampling(rows=4, forwards=2, vocab=V, device="cpu")
    logits = torch.randn(3, V, generator=g)
    bias = torch.zeros(3, V)
    bias[:, torch.argmax(logits, dim=-1)] = -100.0  # bans every row's own argmax
    rows = _rows(3, g, greedy=[True, False, True], bias=bias)
    state.load(rows, g)
    tokens = state.draw(logits, forward=0)
    assert torch.equal(tokens[rows.greedy], torch.argmax(logits + bias, dim=-1)[rows.greedy])
    assert torch.allclose(state.probs[:3, 0], sampling_probs(logits, rows))
    unbiased = SamplingRows(**{**rows.__dict__, "logit_bias": None})
    state.load(unbiased, g)
    assert not state.bias.any()
    assert torch.equal(state.draw(logits, forward=1)[rows.greedy], torch.argmax(logits, dim=-1)[rows.greedy])


def test_a_nan_distribution_still_draws_a_token_of_the_vocabulary():
    q = torch.full((2, 5), float("nan"))
    assert draw(q, torch.tensor([0.3, 0.9], dtype=torch.float64)).max() <= 4


@pytest.mark.parametrize(
    "sampled, graphs, rows, greedy, serves",
    [
        (True, True, 64, False, True),  # fits the sampled graphs
        (True, True, 65, False, False),  # past them: one forward at a time, through the decode graphs
        (True, True, 500, True, True),  # greedy rows chain at any size (eagerly past the greedy graphs)
        (True, False, 500, False, True),  # no graphs: every size chains
        (False, False, 2, False, False),  # sampled chains off
    ],
)
def test_which_batches_a_chain_serves(sampled, graphs, rows, greedy, serves):
    from types import SimpleNamespace

    from faser_sglang.spec_worker.draft_chain import DraftChains

    chains = SimpleNamespace(sampled=sampled, graphs=graphs, sampled_graph_rows=64 if graphs else 0)
    assert DraftChains.serves(chains, rows, greedy) is serves
