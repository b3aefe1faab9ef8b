"""Which forward feeds a chunk, and the index maps it uses (the forwards themselves
run end to end in test_e2e_faser.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.batch_views import ChunkTokens
from faser_sglang.spec_worker.chunk_forward import ChunkForward, _last_token_index, pieces
from faser_sglang.spec_worker.policy import MAX_CATCHUP_PIECES, catchup_forwards
from faser_sglang.spec_worker.worker import fit_token_budget


def runner_with_graphs(max_bs: int | None, max_running_requests: int = 256) -> SimpleNamespace:
    graphs = None if max_bs is None else SimpleNamespace(max_bs=max_bs)
    return SimpleNamespace(decode_cuda_graph_runner=graphs, max_running_requests=max_running_requests)


def test_auto_takes_decode_rows_only_when_the_graphs_fit():
    chunks = ChunkForward(runner_with_graphs(64), req_to_token_pool=None, mode="auto")
    assert chunks.uses_decode_rows(1)
    assert chunks.uses_decode_rows(64)
    assert not chunks.uses_decode_rows(65)


def test_auto_without_graphs_extends():
    chunks = ChunkForward(runner_with_graphs(None), req_to_token_pool=None, mode="auto")
    assert chunks.graph_rows() == 0
    assert not chunks.uses_decode_rows(1)


@pytest.mark.parametrize("mode, rows", [("decode_rows", True), ("extend", False)])
def test_forced_modes_ignore_graphs(mode, rows):
    chunks = ChunkForward(runner_with_graphs(8), req_to_token_pool=None, mode=mode)
    assert chunks.uses_decode_rows(200) is rows
    assert chunks.uses_decode_rows(1) is rows


def test_decode_rows_never_exceed_the_decode_buffers():
    """SGLang's decode buffers hold --max-running-requests rows; more runs as EXTEND."""
    chunks = ChunkForward(runner_with_graphs(None, max_running_requests=16), None, mode="decode_rows")
    assert chunks.uses_decode_rows(16)
    assert not chunks.uses_decode_rows(17)
    auto = ChunkForward(runner_with_graphs(64, max_running_requests=16), None, mode="auto")
    assert auto.graph_rows() == 16
    assert not auto.uses_decode_rows(17)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="chunk forward"):
        ChunkForward(runner_with_graphs(8), req_to_token_pool=None, mode="graphs")
    with pytest.raises(ValueError, match="chunk_forward"):
        FaserConfig(chunk_forward="graphs")


def test_last_token_index():
    assert _last_token_index([2, 1, 3]) == [1, 2, 5]
    assert _last_token_index([1]) == [0]


@pytest.mark.parametrize(
    "lengths, budget, fitted",
    [
        ([5, 1, 3, 0], 10, [3, 1, 2, 0]),  # the docstring's example
        ([5, 1, 3, 0], 13, [5, 1, 3, 0]),  # fits: unchanged
        ([5, 1, 3, 0], None, [5, 1, 3, 0]),  # no graphs: unchanged
        ([7, 7, 7, 7], 10, [2, 2, 1, 1]),
        ([7, 7, 7, 7], 4, [0, 0, 0, 0]),  # room for no drafts
        ([7, 7, 7, 7], 3, [7, 7, 7, 7]),  # batch beyond the graphs: eager anyway
    ],
)
def test_fit_token_budget(lengths, budget, fitted):
    got = fit_token_budget(lengths, budget)
    assert got == fitted
    if budget is not None and len(lengths) <= budget:
        assert sum(got) + len(got) <= budget
        assert all(0 <= g <= k for g, k in zip(got, lengths))


def test_pieces_cut_the_chunk_in_order():
    # The module docstring's example: rows [0, 2], starts [10, 4], lens [2, 1].
    assert pieces([0, 2], [10, 4], [2, 1], 2) == [[(0, 10, 2)], [(2, 4, 1)]]
    assert pieces([0, 2], [10, 4], [2, 1], 1) == [[(0, 10, 1)], [(0, 11, 1)], [(2, 4, 1)]]
    assert pieces([0, 2], [10, 4], [2, 1], 3) == [[(0, 10, 2), (2, 4, 1)]]
    cut = pieces([0, 1, 2], [5, 9, 0], [7, 1, 4], 5)
    assert all(sum(n for _, _, n in p) <= 5 for p in cut)
    # Every token exactly once, each row's positions contiguous and ascending.
    fed = [(row, start + j) for p in cut for row, start, n in p for j in range(n)]
    assert fed == [(0, p) for p in range(5, 12)] + [(1, 9)] + [(2, p) for p in range(4)]


def test_catch_up_forwards_in_pieces_up_to_the_limit():
    chunks = ChunkForward(runner_with_graphs(64), req_to_token_pool=None, mode="auto")
    assert chunks.forwards(64, max_pieces=8) == 1
    assert chunks.forwards(65, max_pieces=8) == 2
    assert chunks.forwards(512, max_pieces=8) == 8
    assert chunks.uses_decode_rows(512, max_pieces=8) and not chunks.uses_decode_rows(512)
    assert chunks.forwards(513, max_pieces=8) == 1  # one EXTEND
    assert not chunks.uses_decode_rows(513, max_pieces=8)
    assert ChunkForward(runner_with_graphs(64), None, mode="extend").forwards(500, max_pieces=8) == 1
    rows = ChunkForward(runner_with_graphs(None, max_running_requests=4), None, mode="decode_rows")
    assert rows.row_limit() == 4 and rows.forwards(9, max_pieces=8) == 3


def test_catchup_forwards_prices_pieces_up_to_the_limit():
    assert catchup_forwards(5, None) == 1
    assert catchup_forwards(128, 128) == 1
    assert catchup_forwards(129, 128) == 2
    assert catchup_forwards(100_000, 128) == MAX_CATCHUP_PIECES  # one EXTEND, about as dear


def test_last_logits_in_pieces_feed_each_piece_in_order(monkeypatch):
    """Each piece gets its own tokens and KV slots; the rows' last logits come back in
    row order though the forwards share one output buffer (as CUDA graphs do)."""
    chunks = ChunkForward(runner_with_graphs(None, max_running_requests=3), None, mode="decode_rows")
    shared = torch.zeros(3, 1)
    fed = []

    def fake_decode_rows(batch, tokens, input_ids, out_cache_loc):
        fed.append((tokens.rows_cpu, tokens.positions_cpu, tokens.packed.tolist(), input_ids.tolist(),
                    out_cache_loc.tolist()))  # fmt: skip
        shared.zero_()
        shared[: len(input_ids), 0] = input_ids.float()  # each row's "logit": its token id
        return shared[: len(input_ids)]

    monkeypatch.setattr(chunks, "_decode_rows", fake_decode_rows)
    rows, starts, lens = [0, 2, 5], [10, 4, 7], [4, 1, 2]
    batch = fake_batch(pool_rows=[30, 31, 32, 33, 34, 35])
    tokens = ChunkTokens.of(batch, rows, starts, lens)
    ids = torch.arange(100, 107)  # [7]: row 0 100..103, row 2 104, row 5 105..106
    slots = torch.arange(200, 207)
    out = chunks._last_logits_in_pieces(batch, rows, starts, lens, tokens, ids, slots)
    assert fed == [
        ((0, 0, 0), (10, 11, 12), [[0, 0, 0], [10, 11, 12], [30, 30, 30]], [100, 101, 102], [200, 201, 202]),
        ((0, 2, 5), (13, 4, 7), [[0, 2, 5], [13, 4, 7], [30, 32, 35]], [103, 104, 105], [203, 204, 205]),
        ((5,), (8,), [[5], [8], [35]], [106], [206]),
    ]
    assert out[:, 0].tolist() == [103, 104, 106]  # last tokens of rows 0, 2, 5
    with pytest.raises(ValueError, match="limit"):
        pieces([0], [0], [1], 0)


def fake_batch(pool_rows: list[int], host_copy: bool = True) -> SimpleNamespace:
    """The ScheduleBatch fields ChunkTokens reads: each request's request-pool row, from
    SGLang's host copy of req_pool_indices or (without one) from the requests."""
    reqs = [SimpleNamespace(req_pool_idx=r) for r in pool_rows]
    cpu = torch.tensor(pool_rows, dtype=torch.int64) if host_copy else None
    return SimpleNamespace(reqs=reqs, seq_lens=torch.zeros(len(reqs), dtype=torch.int64), req_pool_indices_cpu=cpu)


def test_chunk_tokens_index_each_token_from_host_lists_in_one_copy():
    batch = fake_batch(pool_rows=[5, 7, 3])
    tokens = ChunkTokens.of(batch, rows=[0, 2], starts=[10, 4], lens=[2, 1])
    assert (tokens.rows_cpu, tokens.positions_cpu) == ((0, 0, 2), (10, 11, 4))
    req_to_token = torch.arange(8 * 16, dtype=torch.int32).view(8, 16)  # slot = pool row * 16 + position
    slots = tokens.kv_slots(req_to_token)
    assert slots.dtype == torch.int64 and slots.tolist() == [5 * 16 + 10, 5 * 16 + 11, 3 * 16 + 4]
    assert tokens.selection().rows.tolist() == [0, 0, 2]
    lens_cpu, lens = tokens.decode_lengths()
    assert lens_cpu == [11, 12, 5] and lens.tolist() == [11, 12, 5]
    assert ChunkTokens.of(fake_batch([5, 7, 3], host_copy=False), [0, 2], [10, 4], [2, 1]).packed.tolist() == (
        tokens.packed.tolist()
    )
    second = tokens.piece(1, 2)
    assert len(second) == 2 and second.kv_slots(req_to_token).tolist() == [5 * 16 + 11, 3 * 16 + 4]
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # one host-to-device copy: one tensor built
        ChunkTokens.of(batch, rows=[0, 1, 2], starts=[3, 4, 5], lens=[2, 2, 2])
    assert sum(e.count for e in prof.key_averages() if e.key == "aten::lift_fresh") <= 1


def test_graphed_only_when_every_forward_of_the_chunk_replayed_a_graph():
    """What the worker reports to SGLang's decode-batch log (``cuda graph:``) for a
    drafting step: whether each forward of its verify replayed a CUDA graph."""
    runner = runner_with_graphs(64)
    chunks = ChunkForward(runner, None, mode="auto")

    def chunk(*replayed: bool) -> bool:  # one chunk's forwards (pieces), as logits() runs them
        flags = iter(replayed)
        runner.forward = lambda fb: SimpleNamespace(logits_output=fb, can_run_graph=next(flags))
        chunks.graphed = True
        assert [chunks._forward(i) for i in range(len(replayed))] == list(range(len(replayed)))
        return chunks.graphed

    assert chunk(True) and chunk(True, True)
    assert not chunk(False) and not chunk(True, False)
