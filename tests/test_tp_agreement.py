"""Per-rank decisions under tensor parallelism are identical: two processes joined
by a gloo group stand in for two TP ranks (tp_sync.py says what must agree)."""

from __future__ import annotations

import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.accept import accept
from faser_sglang.spec_worker.policy import RandomLengthPolicy, StepContext, make_policy
from faser_sglang.spec_worker.sampling import SamplingRows
from faser_sglang.spec_worker.tp_sync import RankAgreement, shared_seed

WORLD = 2
BS, K, V = 6, 4, 11
STEPS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sampling(bs: int) -> SamplingRows:
    # Mixed batch: rows 0-1 greedy (top_k 1, as SGLang encodes it), the rest sampled.
    top_ks = torch.tensor([1, 1, 5, V, V, 3])
    return SamplingRows(
        temperatures=torch.tensor([1.0, 1.0, 0.7, 1.0, 1.3, 0.9]),
        top_ks=top_ks,
        top_ps=torch.tensor([1.0, 1.0, 0.9, 1.0, 0.8, 1.0]),
        min_ps=torch.zeros(bs),
        greedy=top_ks <= 1,
        logit_bias=None,
        greedy_cpu=tuple(bool(x) for x in top_ks <= 1),
    )


def _rank_main(rank: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        group = dist.group.WORLD
        agree = RankAgreement(world_size=WORLD, src=0, is_src=rank == 0, cpu_group=group, device_group=group)
        # Each rank's policy has its own state (a different seed): only agreement
        # makes their lengths equal.
        policy = RandomLengthPolicy(random.Random(1000 + rank))
        seed = shared_seed(None, server_random_seed=1234)
        generator = torch.Generator().manual_seed(seed)
        ema = make_policy(FaserConfig())
        rids = [f"r{i}" for i in range(BS)]
        context = StepContext(tuple(range(10, 10 + BS)), tuple(range(10, 10 + BS)))
        steps = []
        for step in range(STEPS):
            lengths = agree.lengths(policy.choose(rids, K, context))
            # Draft tokens sampled per rank from different streams, then agreed.
            drafts = torch.randint(0, V, (BS, K), generator=torch.Generator().manual_seed(rank * 97 + step))
            agree.tokens(drafts)
            # The target logits every rank holds are the all-gathered ones: identical.
            logits = torch.randn(BS, K + 1, V, generator=torch.Generator().manual_seed(step))
            q = torch.softmax(torch.randn(BS, K, V, generator=torch.Generator().manual_seed(500 + step)), -1)
            draft_lens = torch.tensor(lengths, dtype=torch.int64)
            result = accept(logits, drafts, q, draft_lens, _sampling(BS), generator)
            num_accepted = [a - 1 for a in result.accept_lens.tolist()]
            ema.observe(rids, lengths, num_accepted)
            steps.append(
                (lengths, drafts.tolist(), result.tokens.tolist(), result.accept_lens.tolist(),
                 ema.choose(rids, K, context))
            )  # fmt: skip
        queue.put((rank, steps))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_two_ranks_make_identical_decisions():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    # The agreement did something: the ranks' own policies disagree.
    own = [RandomLengthPolicy(random.Random(1000 + r)).choose([f"r{i}" for i in range(BS)], K) for r in range(WORLD)]
    assert own[0] != own[1]
    assert any(len(set(lengths)) > 1 for lengths, *_ in results[0])


def test_single_rank_is_the_identity():
    agree = RankAgreement.single()
    assert agree.lengths([3, 0, 2]) == [3, 0, 2]
    t = torch.tensor([[1, 2]])
    assert agree.tokens(t) is t


def test_shared_seed_prefers_the_config_and_needs_one():
    assert shared_seed(7, 99) == 7
    assert shared_seed(None, 99) == 99
    with pytest.raises(ValueError, match="random-seed"):
        shared_seed(None, None)
