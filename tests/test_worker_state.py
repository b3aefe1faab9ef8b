"""The worker's state across steps: device token history, draft KV bound, and the
acceptance that reaches the policy one step late under the overlap schedule."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from faser_sglang.metrics import FaserStats, PhaseClock, PhaseRanges
from faser_sglang.spec_worker.draft_ahead import AheadDrafts, ReadFence
from faser_sglang.spec_worker.policy import StepContext, Untimed
from faser_sglang.spec_worker.sampling import SamplingRows
from faser_sglang.spec_worker.state import FaserDraftState
from faser_sglang.spec_worker.token_history import TokenHistory
from faser_sglang.spec_worker.tp_sync import RankAgreement
from faser_sglang.spec_worker.worker import FORGET_AFTER_STEPS, FaserWorker, PendingStep


def _req(rid: str, pool_row: int, fill: list[int]):
    return SimpleNamespace(rid=rid, req_pool_idx=pool_row, get_fill_ids=lambda: fill)


def test_token_history_prefill_steps_and_reads():
    history = TokenHistory(torch.zeros((4, 16), dtype=torch.int32), k_max=3)
    assert history.ids.shape == (4, 16 + 3 + 1)  # a step writes its whole verify chunk
    reqs = [_req("a", 1, [5, 6, 7]), _req("b", 3, [8, 9])]
    prefill = SimpleNamespace(
        reqs=reqs, req_pool_indices=torch.tensor([1, 3]), seq_lens=torch.tensor([3, 2])
    )
    history.write_prefill(prefill, torch.tensor([70, 90]))  # first tokens at positions 3 and 2
    assert history.bonus(prefill).tolist() == [70, 90]
    assert history.gather([1, 1, 1, 1, 3, 3, 3], [0, 1, 2, 3, 0, 1, 2]).tolist() == [5, 6, 7, 70, 8, 9, 90]

    # A step: row "a" accepted 2 of 3 drafts (emits 71 72 73, then junk), "b" none (91).
    tokens = torch.tensor([[71, 72, 73, 0], [91, 0, 0, 0]])
    history.write_step(prefill.req_pool_indices, prefill.seq_lens, tokens)
    after = SimpleNamespace(req_pool_indices=torch.tensor([1, 3]), seq_lens=torch.tensor([6, 3]))
    assert history.bonus(after).tolist() == [73, 91]
    assert history.gather([1] * 7, list(range(7))).tolist() == [5, 6, 7, 70, 71, 72, 73]
    # The next step overwrites the junk past the committed length before anyone reads it.
    history.write_step(after.req_pool_indices, after.seq_lens, torch.tensor([[74], [92]]))
    assert history.gather([1, 3], [7, 4]).tolist() == [74, 92]


def test_draft_kv_bound_resolves_against_the_next_committed_length():
    state = FaserDraftState([13, 8, 4], bonus_tokens=torch.tensor([1, 2, 3]))
    # Row 0 drafted 3 at L = 10 and 1 was accepted (L' = 12): its KV at 12 is a rejected draft.
    assert state.draft_kv_lens([12, 8, 9]) == [12, 8, 4]
    state.future_indices = torch.tensor([5, 6, 7])
    state.filter_batch(torch.tensor([0, 2]), [0, 2])
    assert state.draft_kv_bound == [13, 4]
    assert state.future_indices.tolist() == [5, 7] and state.bonus_tokens.tolist() == [1, 3]
    other = FaserDraftState([0], bonus_tokens=torch.tensor([9]))
    other.future_indices = torch.tensor([2])
    state.merge_batch(other)
    assert state.draft_kv_bound == [13, 4, 0]
    assert state.future_indices.tolist() == [5, 7, 2] and state.bonus_tokens.tolist() == [1, 3, 9]


class _Policy(Untimed):
    def __init__(self):
        self.observed: list[tuple[list[str], list[int], list[int]]] = []
        self.forgotten: list[str] = []

    def observe(self, rids, lengths, accepted):
        self.observed.append((list(rids), list(lengths), list(accepted)))

    def forget(self, rid):
        self.forgotten.append(rid)


def _worker() -> FaserWorker:
    worker = FaserWorker.__new__(FaserWorker)  # the state-keeping part only, no models
    worker.policy = _Policy()
    worker.stats = FaserStats()
    worker._pending = None
    worker._decode_steps = 0
    worker._last_seen = {}
    worker.ahead = None  # drafting ahead off
    return worker


def _pending(rids: list[str], accept_lens: list[int]) -> PendingStep:
    n = len(rids)
    return PendingStep.of(
        rids, [10] * n, [10] * n, [3] * n, torch.tensor(accept_lens), 0.0, PhaseClock(False, "cpu"), "in-step"
    )


def test_acceptance_reaches_the_policy_when_the_next_step_settles():
    worker = _worker()
    worker._pending = _pending(["a", "b"], [4, 1])
    worker._settle()
    assert worker.policy.observed == [(["a", "b"], [3, 3], [3, 0])]
    assert worker.stats.steps == 1 and worker.stats.accepted == 3 and worker._pending is None
    assert worker.stats.summary().endswith("draft_lengths[k3:2] step_kinds[in-step:1]")
    worker._settle()  # nothing pending: nothing observed twice
    assert len(worker.policy.observed) == 1


def test_a_request_forgotten_before_its_step_settles_is_not_observed():
    worker = _worker()
    pending = _pending(["a", "b"], [2, 3])
    pending.ready = lambda: False  # the step is still running on the device
    worker._pending = pending
    worker.note_request_finished(rid="a", natural_stop=True)
    assert worker.policy.forgotten == ["a"] and worker.policy.observed == []
    worker._settle()
    assert worker.policy.observed == [(["b"], [3], [2])]  # "a" would get a window back: a leak
    assert worker.stats.steps == 1  # the statistics still count the whole step


def test_a_finished_request_settles_a_completed_step_first():
    worker = _worker()
    worker._pending = _pending(["a"], [2])
    worker.note_request_finished(rid="a", natural_stop=True)
    assert worker.policy.observed == [(["a"], [3], [1])] and worker.policy.forgotten == ["a"]
    assert worker._pending is None


def test_requests_no_step_carries_any_more_are_forgotten():
    """Under the overlap schedule a request that finishes at its prefill rides one decode
    step and is never reported finished; its policy state must not stay forever."""
    worker = _worker()
    worker._note_batch(["done-at-prefill", "long"])
    for _ in range(FORGET_AFTER_STEPS - 1):
        worker._note_batch(["long"])
    assert worker.policy.forgotten == []  # absent fewer than FORGET_AFTER_STEPS steps
    for _ in range(FORGET_AFTER_STEPS):  # the next sweep
        worker._note_batch(["long"])
    assert worker.policy.forgotten == ["done-at-prefill"]
    worker.note_request_finished(rid="long", natural_stop=True)
    for _ in range(2 * FORGET_AFTER_STEPS):
        worker._note_batch([])
    assert worker.policy.forgotten == ["done-at-prefill", "long"]  # a reported one once


def test_draft_state_refuses_mismatched_rows_and_half_a_relay():
    state = FaserDraftState([3, 4], bonus_tokens=torch.tensor([1, 2]))
    try:
        state.draft_kv_lens([5])
    except RuntimeError as e:
        assert "2 rows, the batch 1" in str(e)
    else:
        raise AssertionError("mismatched rows accepted")
    state.future_indices = torch.tensor([0, 1])
    try:
        state.merge_batch(FaserDraftState([0], bonus_tokens=torch.tensor([3])))
    except RuntimeError as e:
        assert "relay" in str(e)
    else:
        raise AssertionError("half a relay accepted")


class _Forwards:
    """Target forwards that note how many lengths were published before they ran."""

    def __init__(self, published: list):
        self.published = published
        self.published_at_forward: list[int] = []

    def forward_batch_generation(self, batch):  # the target worker's prefill
        self.published_at_forward.append(len(self.published))
        return SimpleNamespace(next_token_ids=torch.tensor([40, 41]))

    def plain_decode(self, batch, bonus, seq_lens):  # VerifyPhase.plain_decode
        self.published_at_forward.append(len(self.published))
        return SimpleNamespace(next_token_ids=torch.tensor([50, 51]), logits_output=None, can_run_cuda_graph=True)


def test_prefill_and_plain_decode_publish_lengths_before_their_forward():
    """Their committed lengths are known up front (prompt; +1 per request): published
    first, the scheduler launches the next step while the GPU runs this one."""
    published: list[list[int]] = []
    forwards = _Forwards(published)
    worker = _worker()
    worker.history = TokenHistory(torch.zeros((4, 16), dtype=torch.int32), k_max=3)
    worker.config = SimpleNamespace(lazy_draft_prefill=True)
    worker._target_worker = forwards
    worker.verify_phase = forwards
    on_publish = lambda lens: published.append(lens.tolist())  # noqa: E731
    batch = SimpleNamespace(
        reqs=[_req("a", 1, [5, 6, 7]), _req("b", 2, [8, 9])],
        req_pool_indices=torch.tensor([1, 2]),
        seq_lens=torch.tensor([3, 2]),
    )
    result = worker._prefill(batch, on_publish)
    assert forwards.published_at_forward == [1] and published == [[3, 2]]
    assert result.new_seq_lens.tolist() == [3, 2] and result.next_draft_input.bonus_tokens.tolist() == [40, 41]

    bonus = worker.history.bonus(batch)
    clock = PhaseClock(False, "cpu")
    context = StepContext((3, 2), (0, 0))
    step = worker._plain_step(batch, ["a", "b"], context, bonus, 0.0, clock, on_publish, PhaseRanges())
    assert forwards.published_at_forward == [1, 2] and published[1] == [4, 3]
    assert step.new_seq_lens.tolist() == [4, 3] and step.accept_lens.tolist() == [1, 1]
    assert worker.history.gather([1, 2], [4, 3]).tolist() == [50, 51]  # next step's bonus tokens


def _plain_worker_drafting_ahead(choice: list[int], launch) -> tuple[FaserWorker, SimpleNamespace, list]:
    """A worker whose plain step drafts ahead: its policy chooses ``choice`` for the next
    step (noting each context), ``launch`` stands for DraftAhead.launch."""
    chosen_for: list[StepContext] = []

    class Chooses(_Policy):
        def choose(self, rids, k_max, context=None):
            chosen_for.append(context)
            return list(choice)

    worker = _worker()
    worker.policy = Chooses()
    worker.ahead = SimpleNamespace(launch=launch)
    # The target's decode graph records its event before the replay (SGLang's WAR barrier).
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(war_fastpath_read_done_event="pre-replay"))
    worker._fence = ReadFence(worker._target_worker.model_runner, "cpu")
    worker.agreement = RankAgreement.single()
    worker.k_max = 3
    worker.generator = None
    worker.server_args = SimpleNamespace(sampling_backend="pytorch")
    worker.history = TokenHistory(torch.zeros((4, 16), dtype=torch.int32), k_max=3)
    worker.verify_phase = _Forwards([])
    reqs = [_req("a", 1, [5, 6, 7]), _req("b", 2, [8, 9])]
    for req, limit in zip(reqs, (10, None)):
        req.sampling_params, req.origin_input_ids = SimpleNamespace(max_new_tokens=limit), req.get_fill_ids()
    batch = SimpleNamespace(
        reqs=reqs, req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([5, 4]), return_logprob=False,
        sampling_info=None,
    )  # fmt: skip
    return worker, batch, chosen_for


def _plain_step(worker: FaserWorker, batch) -> object:
    context = StepContext((5, 4), (3, 4), 64)
    bonus = worker.history.bonus(batch)
    return worker._plain_step(batch, ["a", "b"], context, bonus, 0.0, PhaseClock(False, "cpu"), None, PhaseRanges())


def test_plain_step_drafting_ahead_hands_a_choice_of_no_drafts_to_the_next_step():
    """Drafting ahead, a plain step chooses the next step's lengths from its exact next
    context (every request + 1); where nobody drafts it hands over that choice, so the
    next step neither chooses again nor drafts."""
    worker, batch, chosen_for = _plain_worker_drafting_ahead([0, 0], launch=None)  # a launch would fail
    step = _plain_step(worker, batch)
    assert [(c.seq_lens, c.draft_kv_lens, c.remaining_tokens) for c in chosen_for] == [((6, 5), (3, 4), (6, None))]
    ahead = step.next_draft_input.ahead
    assert ahead.lengths == [0, 0] and ahead.fed == [0, 0] and ahead.tokens.shape == (2, 3)
    assert worker.stats.step_kinds == {"plain": 1}
    assert _barrier_waits_behind_the_step(worker)  # the drafts' zeros are written behind the forward


def test_plain_step_drafting_ahead_queues_the_next_steps_chain(monkeypatch):
    """Where the next step drafts, the plain step launches its chain as a step whose
    rows all drafted nothing and committed one token each."""
    launched = []

    def launch(
        batch, sampling, generator, seq_lens, lengths, kv_bound, next_lengths, accept_lens, new_seq_lens, catch_up
    ):
        launched.append((seq_lens, lengths, kv_bound, next_lengths, accept_lens.tolist(), new_seq_lens.tolist()))
        return AheadDrafts(torch.zeros((2, 3), dtype=torch.int64), None, list(next_lengths), [2, 0])

    monkeypatch.setattr(SamplingRows, "from_sampling_info", staticmethod(lambda info, backend, reqs: "sampling"))
    worker, batch, _ = _plain_worker_drafting_ahead([2, 0], launch)
    step = _plain_step(worker, batch)
    assert launched == [((5, 4), [0, 0], [3, 4], [2, 0], [1, 1], [6, 5])]
    assert step.next_draft_input.ahead.lengths == [2, 0]
    assert worker.stats.step_kinds == {"plain+chain": 1}
    assert _barrier_waits_behind_the_step(worker)


def _barrier_waits_behind_the_step(worker: FaserWorker) -> bool:
    """Whether the event SGLang's WAR barrier takes after the step is the fence recorded
    behind the work queued after the target forward, not the forward's own."""
    return isinstance(worker.war_fastpath_runner.war_fastpath_read_done_event, torch.cpu.Event)


def test_read_fence_moves_the_war_barrier_behind_work_queued_after_the_target():
    """SGLang's scheduler waits on ``war_fastpath_read_done_event`` after each step and
    clears it. The fence hands it the target runner's event unless the step queued work
    after the target forward; an event no barrier took is forgotten at the next step."""
    runner = SimpleNamespace(war_fastpath_read_done_event="pre-replay")
    fence = ReadFence(runner, "cpu")
    assert fence.war_fastpath_read_done_event == "pre-replay"
    fence.after_queued_work()
    queued = fence.war_fastpath_read_done_event
    assert isinstance(queued, torch.cpu.Event)
    fence.war_fastpath_read_done_event = None  # the scheduler, after waiting on it
    assert fence.war_fastpath_read_done_event is None and runner.war_fastpath_read_done_event is None
    fence.after_queued_work()  # a step whose barrier never ran
    fence.step_began()
    runner.war_fastpath_read_done_event = "next pre-replay"
    assert fence.war_fastpath_read_done_event == "next pre-replay"
