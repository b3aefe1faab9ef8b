"""Acceptance with hand-built logits: greedy and sampled, ragged lengths."""

import torch

from faser_sglang.spec_worker.accept import accept, accept_greedy, accept_sampled
from faser_sglang.spec_worker.sampling import SamplingRows
from host_reads import host_reads

V = 8


def one_hot_logits(tokens: list[list[int]]) -> torch.Tensor:
    """[bs, K+1, V] logits whose argmax at each slot is the given token."""
    t = torch.tensor(tokens)
    logits = torch.full((*t.shape, V), -5.0)
    logits.scatter_(2, t.unsqueeze(2), 5.0)
    return logits


def rows(bs: int, *, greedy: list[bool], temperature: float = 1.0, top_k: int = V) -> SamplingRows:
    g = torch.tensor(greedy)
    return SamplingRows(
        temperatures=torch.full((bs,), temperature),
        top_ks=torch.where(g, torch.ones(bs, dtype=torch.int64), torch.full((bs,), top_k)),
        top_ps=torch.ones(bs),
        min_ps=torch.zeros(bs),
        greedy=g,
        logit_bias=None,
        greedy_cpu=tuple(greedy),
    )


def test_greedy_full_match_emits_all_drafts_plus_bonus():
    target = torch.tensor([[3, 4, 5, 6]])
    res = accept_greedy(target, torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    assert res.accept_lens.tolist() == [4]
    assert res.tokens[0, :4].tolist() == [3, 4, 5, 6]


def test_greedy_early_mismatch_emits_correction():
    target = torch.tensor([[3, 1, 5, 6]])
    res = accept_greedy(target, torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    assert res.accept_lens.tolist() == [2]  # d0 accepted, correction = target[1]
    assert res.tokens[0, :2].tolist() == [3, 1]


def test_greedy_first_token_mismatch():
    res = accept_greedy(torch.tensor([[7, 4, 5, 6]]), torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    assert res.accept_lens.tolist() == [1]
    assert res.tokens[0, 0].item() == 7


def test_greedy_zero_length_is_plain_decode():
    # k = 0: the padded drafts equal the target but must not count.
    res = accept_greedy(torch.tensor([[2, 2, 2]]), torch.tensor([[2, 2]]), torch.tensor([0]))
    assert res.accept_lens.tolist() == [1]
    assert res.tokens[0, 0].item() == 2


def test_greedy_mixed_lengths_in_one_batch():
    target = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0], [1, 1, 1, 1], [2, 3, 0, 0]])
    drafts = torch.tensor([[1, 2, 3], [5, 9, 0], [1, 1, 1], [2, 0, 0]])
    lens = torch.tensor([3, 2, 0, 1])
    res = accept_greedy(target, drafts, lens)
    assert res.accept_lens.tolist() == [4, 2, 1, 2]


def test_mixed_batch_routes_greedy_and_sampled_rows():
    # Row 0 greedy, row 1 sampled with a target that is one-hot at every slot:
    # the sampled row then behaves exactly like greedy (p(d) = 1 or 0).
    logits = one_hot_logits([[1, 2, 3], [4, 5, 6]]) * 10
    drafts = torch.tensor([[1, 7], [4, 5]])
    q = torch.full((2, 2, V), 1.0 / V)
    res = accept(logits, drafts, q, torch.tensor([2, 2]), rows(2, greedy=[True, False]))
    assert res.accept_lens.tolist() == [2, 3]
    assert res.tokens[0, :2].tolist() == [1, 2]
    assert res.tokens[1, :3].tolist() == [4, 5, 6]


def test_mixed_batch_accepts_without_reading_the_device_back():
    """Which rows sample is known on the host: no op whose size or value the host must
    read back (on a GPU, a wait for all queued work)."""
    logits = one_hot_logits([[1, 2, 3], [4, 5, 6], [7, 1, 2]]) * 10
    q = torch.full((3, 2, V), 1.0 / V)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        accept(logits, torch.tensor([[1, 7], [4, 5], [7, 1]]), q, torch.tensor([2, 2, 1]),
               rows(3, greedy=[False, True, False]), torch.Generator().manual_seed(0))  # fmt: skip
    assert not host_reads(prof.events())


def test_sampled_k_max_all_accepted_when_draft_equals_target():
    p = torch.softmax(torch.randn(1, 4, V), dim=-1)
    drafts = torch.tensor([[0, 1, 2]])
    res = accept_sampled(p, p[:, :3].clone(), drafts, torch.tensor([3]))
    assert res.accept_lens.tolist() == [4]  # p/q = 1 everywhere


def test_sampled_rejects_token_target_never_emits():
    p = torch.zeros(1, 2, V)
    p[0, :, 5] = 1.0
    q = torch.zeros(1, 1, V)
    q[0, 0, 3] = 1.0
    res = accept_sampled(p, q, torch.tensor([[3]]), torch.tensor([1]))
    assert res.accept_lens.tolist() == [1]
    assert res.tokens[0, 0].item() == 5


def test_per_request_temperature_and_top_k_apply():
    # Sampled row with top_k = 1 is deterministic: the correction is the argmax.
    logits = torch.zeros(1, 2, V)
    logits[0, :, 6] = 1.0
    drafts = torch.tensor([[2]])
    q = torch.zeros(1, 1, V)
    q[0, 0, 2] = 1.0
    r = rows(1, greedy=[False], top_k=1)
    for _ in range(5):
        res = accept(logits, drafts, q, torch.tensor([1]), r)
        assert res.tokens[0, 0].item() == 6 and res.accept_lens.item() == 1
