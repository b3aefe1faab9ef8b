"""The FASER speculative worker SGLang's scheduler drives.

One decode step, for a continuous batch where every request has its own length:

    lengths = policy.choose(requests)            # k_i in [0, K_max]
    drafts  = draft phase (about max k_i forwards) # only requests with k_i > 0
    logits  = verify phase (one ragged forward)  # k_i + 1 tokens per request
    result  = accept(logits, drafts)             # greedy / rejection sampling
    policy.observe(accepted)                     # feeds the next step's lengths

The scheduler owns KV allocation (it reserves 2 * (K_max + 1) slots past each
request's committed length before the step), commits ``accept_lens`` tokens per
request afterwards and frees everything when a request ends; the worker only
writes into the reserved slots.

Overlap schedule (SGLang's default; ``--disable-overlap-schedule`` runs the same code
synchronously): the scheduler launches step N+1 before it processes step N, so the
host learns what step N emitted only while step N+1 runs. The worker therefore reads
tokens from a device history that every step writes (token_history.py), publishes
each step's new committed lengths for the scheduler (``on_publish``), derives the
draft's valid KV fill from those lengths (state.py), and feeds a drafting step's
acceptance to the policy when the next step starts: lengths are chosen with the
acceptance of every step but the one still in flight.

Drafting ahead (``draft_ahead``, draft_ahead.py): after its accept a step chooses the
next step's lengths and queues that step's draft chain on the device; the next step
then takes those lengths and drafts (``state.ahead``) and goes straight to its verify.
A plain step (no request drafts) does the same behind its forward.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import compute_spec_v2_logprobs
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from faser_sglang import memory_plan
from faser_sglang.config import FaserConfig
from faser_sglang.layout import RaggedLayout
from faser_sglang.metrics import FaserStats, PhaseClock, PhaseRanges, annotate
from faser_sglang.spec_worker.accept import AcceptResult, accept
from faser_sglang.spec_worker.adaptive import deployment_from_runners
from faser_sglang.spec_worker.chunk_forward import ChunkForward
from faser_sglang.spec_worker.draft import DraftOutput, DraftPhase
from faser_sglang.spec_worker.draft_ahead import (
    AheadDrafts,
    DraftAhead,
    ReadFence,
    drafts_ahead,
    predicted_context,
    upper_seq_lens,
)
from faser_sglang.spec_worker.draft_model import DraftModel
from faser_sglang.spec_worker.kernel_warmup import warm_decode_allocation, warm_draft_extend_attention
from faser_sglang.spec_worker.policy import StepContext, draft_caps, draft_room, make_policy
from faser_sglang.spec_worker.sampling import SamplingRows
from faser_sglang.spec_worker.state import FaserDraftState
from faser_sglang.spec_worker.token_history import TokenHistory
from faser_sglang.spec_worker.tp_sync import RankAgreement, shared_seed
from faser_sglang.spec_worker.validation import check_draft_matches_target
from faser_sglang.spec_worker.verify import VerifyPhase

logger = logging.getLogger(__name__)

# A request absent from this many decode steps has finished unreported (or waits,
# retracted, long enough that its acceptance window is stale anyway).
FORGET_AFTER_STEPS = 1024


class FaserWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, ps, nccl_port: int, target_worker: TpModelWorker):
        super().__init__()
        self.server_args = server_args
        self.device = server_args.device
        self.k_max: int = server_args.speculative_num_steps
        self.config = FaserConfig.from_env()
        self._target_worker = target_worker
        self._draft_worker = DraftModel(
            server_args, gpu_id, ps, nccl_port, chains=self.config.draft_chain, sampled_chains=self.config.sampled_chain
        )
        check_draft_matches_target(target_worker, self._draft_worker)
        memory_plan.note_draft(self.draft_runner)  # before SGLang plans the target's KV pool
        deployment = None
        if self.config.policy == "adaptive":
            # Only the adaptive policy reads the two models' configs (for its cost model).
            deployment = deployment_from_runners(server_args, target_worker.model_runner, self.draft_runner)
        self.policy = make_policy(self.config, deployment)
        # Under tensor parallelism every rank must feed the same tokens (tp_sync.py).
        self.agreement = RankAgreement.from_sglang_tp_group()
        self.stats = FaserStats(trace_path=self.config.trace_path if self.agreement.is_src else None)
        seed = shared_seed(self.config.seed, server_args.random_seed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.overlap = not server_args.disable_overlap_schedule
        self._pending: Optional[PendingStep] = None
        self.ahead: Optional[DraftAhead] = None  # set with the chains when draft_ahead is on
        self._fence = ReadFence(target_worker.model_runner, self.device)
        self._decode_steps = 0
        self._last_seen: dict[str, int] = {}  # rid -> last decode step that carried it
        logger.info(
            "FASER worker: K_max=%d overlap schedule=%s config=%s", self.k_max, self.overlap, self.config.to_dict()
        )

    # SGLang lifecycle -------------------------------------------------------

    @property
    def draft_runner(self):
        return self._draft_worker.draft_runner

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)
        memory_plan.check_draft_pool(self.draft_runner.token_to_kv_pool, self.draft_runner.max_total_num_tokens)
        vocab = self._target_worker.model_runner.model_config.vocab_size
        mode = self.config.chunk_forward
        self.history = TokenHistory(req_to_token_pool.req_to_token, self.k_max)
        self.draft_phase = DraftPhase(ChunkForward(self.draft_runner, req_to_token_pool, mode), self.k_max, vocab)
        target_chunks = ChunkForward(self._target_worker.model_runner, req_to_token_pool, mode)
        self.verify_phase = VerifyPhase(target_chunks, self._target_worker)

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        target_runner = self._target_worker.model_runner
        warm_decode_allocation(target_runner.req_to_token_pool.req_to_token, target_runner.max_running_requests)
        warm_draft_extend_attention(self.draft_runner)
        self.draft_phase.chains = chains = self._draft_worker.chains
        if self.config.draft_ahead:
            if chains is None or not chains.plans_on_device(1):
                raise ValueError(
                    "FASER draft_ahead needs draft chains that plan on the device: keep draft_chain "
                    "true and pass --speculative-draft-attention-backend triton (FlashInfer plans "
                    "from host lengths, which a chain drafted ahead does not have), or set "
                    "draft_ahead false."
                )
            vocab = self._target_worker.model_runner.model_config.vocab_size
            self.ahead = DraftAhead(chains, self.history, self.k_max, vocab)
            from sglang.srt.mem_cache import allocation_sizing  # the hooked reservation (kv_reserve.py)

            logger.info(
                "FASER draft ahead: each step queues the next one's chain; SGLang reserves %d KV "
                "slots per request and decode step",
                allocation_sizing.get_alloc_reserve_per_decode(self.server_args),
            )

    @property
    def war_fastpath_runner(self) -> ReadFence:
        """Whose event SGLang's WAR barrier waits on after a step: the target's decode
        graph's, or one recorded behind the work a step drafting ahead queued after it
        (draft_ahead.ReadFence)."""
        return self._fence

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self._last_seen.pop(rid, None)
        if self._pending is not None:
            if self._pending.ready():
                self._settle()
            else:
                self._pending.finished.add(rid)  # its acceptance arrives after it is forgotten
        self.policy.forget(rid)

    # One scheduler step -----------------------------------------------------

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        """``on_publish`` (overlap schedule): called with the step's new committed
        lengths as soon as they are on the device, so the scheduler can prepare the
        next step while this one finishes."""
        self._fence.step_began()
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            with annotate(f"prefill bs={len(batch.reqs)}"):
                return self._prefill(batch, on_publish)
        with annotate(f"decode bs={len(batch.reqs)}"):
            ranges = PhaseRanges()
            try:
                return self._decode(batch, on_publish, ranges)
            finally:
                ranges.end()  # inside the step's range, which must hold every phase

    def _prefill(self, batch: ScheduleBatch, on_publish) -> GenerationBatchResult:
        """Target prefill samples each request's first token. Eager draft prefill: the
        draft model prefills the same tokens into its own KV so drafting can start next
        step. Lazy: the draft does not run; each request's draft KV starts empty (also
        for a prefix from the radix cache, whose draft KV a lazy request may never have
        filled) and its first draft's catch-up feeds the whole sequence."""
        # Spec convention: seq_lens stays the committed length; the sampled token is
        # the bonus token of the first decode step. Those lengths are known before the
        # forward, so they are published first: the scheduler, which waits for them
        # before it launches the next step, launches it while the prefill still runs
        # (every read of this step's output is on the device, in stream order).
        self.policy.prefill_ran()
        new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        result = self._target_worker.forward_batch_generation(batch)
        self.history.write_prefill(batch, result.next_token_ids)
        result.new_seq_lens = new_seq_lens
        if self.config.lazy_draft_prefill:
            draft_kv_lens = [0] * len(batch.reqs)
        else:
            draft_view = _without_spec_info(batch)
            fb = ForwardBatch.init_new(
                draft_view,
                self.draft_runner,
                capture_hidden_mode=CaptureHiddenMode.NULL,
                return_hidden_states_before_norm=False,
            )
            fb.return_logprob = False
            self.draft_runner.forward(fb)
            draft_kv_lens = batch.seq_lens_cpu.tolist()
        result.next_draft_input = FaserDraftState(draft_kv_lens, bonus_tokens=result.next_token_ids)
        return result

    def _decode(self, batch: ScheduleBatch, on_publish, ranges: PhaseRanges) -> GenerationBatchResult:
        # The scheduler has waited for the previous step's published lengths, so its
        # acceptance is on the device already (a prefill does not wait: it does not settle).
        ranges.begin("settle")
        self._settle()
        ranges.begin("policy")
        started = time.perf_counter()
        clock = self.stats.clock(self.device)
        state: FaserDraftState = batch.spec_info
        rids = [req.rid for req in batch.reqs]
        self._note_batch(rids)
        seq_lens = batch.seq_lens_cpu.tolist()
        draft_kv_lens = state.draft_kv_lens(seq_lens)
        budget = self.verify_phase.chunks.token_budget()
        remaining = remaining_tokens(batch.reqs, seq_lens)
        context = StepContext(
            tuple(seq_lens),
            tuple(draft_kv_lens),
            budget,
            self.draft_phase.chunks.row_limit() or None,
            tuple(remaining),
            self.draft_phase.chains_batch(batch.reqs, batch.sampling_info),
        )
        # Drafted ahead: the lengths were chosen at the end of the last step (draft_ahead.py).
        ahead = state.ahead if self.ahead is not None and drafts_ahead(batch) else None
        chosen = ahead.lengths if ahead is not None else self.policy.choose(rids, self.k_max, context)
        lengths = cap_to_remaining(chosen, remaining)
        lengths = self.agreement.lengths(fit_token_budget(lengths, budget))
        self.policy.step_began(started, lengths, context)
        bonus = self.history.bonus(batch)  # [bs]
        if not any(lengths) and not batch.return_logprob:
            clock.mark("policy")
            ranges.begin("plain")
            return self._plain_step(batch, rids, context, bonus, started, clock, on_publish, ranges)
        layout = RaggedLayout.build(lengths, self.k_max, batch.seq_lens.device)
        sampling = SamplingRows.from_sampling_info(batch.sampling_info, self.server_args.sampling_backend, batch.reqs)
        clock.mark("policy")

        ranges.begin("draft")
        if ahead is not None:
            with annotate("draft.ahead"):
                drafts = self._drafts_from_ahead(ahead, layout, sampling, seq_lens, draft_kv_lens)
        else:
            drafts = self.draft_phase.run(batch, layout, draft_kv_lens, sampling, self.generator, self.history)
        self.agreement.tokens(drafts.tokens)
        clock.mark("draft")
        clock.label("catchup_forwards", drafts.catchup_forwards)
        clock.label("draft_steps", drafts.steps)
        if context.catchup_piece_tokens is not None:  # the profile prices catch-ups with it
            clock.label("catchup_piece_tokens", context.catchup_piece_tokens)
        clock.label("verify_forward", self.verify_phase.chunks.forward_name(layout.num_verify_tokens))
        ranges.begin("verify")
        logits = layout.to_padded(
            self.verify_phase.run(batch, layout, bonus, drafts.tokens)
        )  # [bs, K+1, V]
        clock.mark("verify")
        ranges.begin("accept")
        result = accept(logits, drafts.tokens, drafts.probs, layout.draft_lens, sampling, self.generator)
        accept_lens = result.accept_lens.to(torch.int32)  # [bs]
        new_seq_lens = batch.seq_lens + accept_lens.to(batch.seq_lens.dtype)
        self.history.write_step(batch.req_pool_indices, batch.seq_lens, result.tokens)
        if on_publish is not None:
            on_publish(new_seq_lens)
        last = result.tokens.gather(1, (accept_lens - 1).long().unsqueeze(1)).squeeze(1)  # [bs] next bonus
        clock.mark("accept")
        kind = "ahead" if ahead is not None else "in-step"
        self._pending = PendingStep.of(rids, seq_lens, draft_kv_lens, lengths, result.accept_lens, started, clock, kind)
        # Draft KV is valid up to the committed length it was fed (FaserDraftState).
        next_state = FaserDraftState(drafts.draft_kv_lens, last)
        phase_left = False
        if self.ahead is not None and drafts_ahead(batch):
            ranges.begin("ahead")  # queued behind the accept, before any wait for it
            next_lengths = self._choose_ahead(batch, rids, context, lengths, drafts.draft_kv_lens)
            next_state.ahead = self._draft_ahead(
                batch, sampling, context, lengths, drafts.draft_kv_lens, next_lengths, result.accept_lens,
                new_seq_lens, clock,
            )  # fmt: skip
            self._fence.after_queued_work()
            phase_left = True
        if not self.overlap:
            ranges.begin("settle")
            self._settle()  # the synchronous schedule waits for this step's results anyway
            phase_left = True
        if phase_left:
            ranges.begin("accept")  # building the result
        return self._result(batch, result, accept_lens, logits, new_seq_lens, next_state)

    def _drafts_from_ahead(
        self,
        ahead: AheadDrafts,
        layout: RaggedLayout,
        sampling: SamplingRows,
        seq_lens: list[int],
        draft_kv_lens: list[int],
    ) -> DraftOutput:
        tokens, probs, kv_bound = self.ahead.drafts_for(ahead, layout.draft_lens, sampling, seq_lens, draft_kv_lens)
        return DraftOutput(tokens, probs, kv_bound, 0, steps="ahead")

    def _choose_ahead(
        self,
        batch: ScheduleBatch,
        rids: list[str],
        context: StepContext,
        lengths: Sequence[int],  # [bs] this step's k
        kv_bound: Sequence[int],  # [bs] draft KV bound after this step's draft phase
    ) -> list[int]:
        """[bs] the next step's k', chosen at the end of this step from its predicted
        context (draft_ahead.predicted_context: exact after a plain step)."""
        upper = upper_seq_lens(context.seq_lens, lengths)
        predicted = predicted_context(context, upper, kv_bound, remaining_tokens(batch.reqs, upper))
        chosen = cap_to_remaining(self.policy.choose(rids, self.k_max, predicted), predicted.remaining_tokens)
        return self.agreement.lengths(fit_token_budget(chosen, predicted.max_verify_tokens))

    def _draft_ahead(
        self,
        batch: ScheduleBatch,
        sampling: SamplingRows,
        context: StepContext,
        lengths: Sequence[int],  # [bs] this step's k
        kv_bound: Sequence[int],  # [bs] draft KV bound after this step's draft phase
        next_lengths: list[int],  # [bs] k' (``_choose_ahead``)
        accept_lens: torch.Tensor,  # [bs] this step's accepted drafts + 1, on the device
        new_seq_lens: torch.Tensor,  # [bs]
        clock: PhaseClock,
    ) -> Optional[AheadDrafts]:
        """Queue the next step's chain behind this step's accept (draft_ahead.py); None
        where the next step drafts for itself.

        Rows the chain starts after a catch-up of their own (draft_ahead.rows_to_catch_up)
        keep their older draft KV bound in the state: the next step's context then shows
        the gap that catch-up closed, so the cost model prices it in the step it serves
        (as the chain it precedes), and a next step that cannot use the drafts (a
        logprob request joined) feeds those tokens again."""

        def catch_up(rows: list[int], bound: Sequence[int]) -> list[int]:
            with annotate("draft.ahead_catchup"):
                after = self.draft_phase.catch_up_ahead(batch, rows, context.seq_lens, bound, self.history)
            clock.label("ahead_catchup_rows", len(rows))
            return after

        ahead = self.ahead.launch(
            batch, sampling, self.generator, context.seq_lens, lengths, kv_bound, next_lengths, accept_lens,
            new_seq_lens, catch_up,
        )  # fmt: skip
        if ahead is not None:
            self.agreement.tokens(ahead.tokens)
        return ahead

    def _plain_step(
        self,
        batch: ScheduleBatch,
        rids: list[str],
        context: StepContext,
        bonus: torch.Tensor,  # [bs]
        started: float,
        clock: PhaseClock,
        on_publish,
        ranges: PhaseRanges,
    ) -> GenerationBatchResult:
        """No request drafts: a plain decode step (verify.py), one token per request.
        The draft model does not run; its KV lags one more token, caught up when the
        request drafts again. Drafting ahead, the step chooses the next step's lengths
        (its context is exact: every request commits one token) and, where some request
        drafts, queues that step's chain behind the forward, catching up the requests
        it drafts for first."""
        seq_lens, draft_kv_lens = list(context.seq_lens), list(context.draft_kv_lens)
        clock.mark("draft")
        clock.label("verify_forward", "plain_decode")
        # Every request commits one token: published before the forward, so the
        # scheduler launches the next step while this one runs, as it does without
        # speculation.
        new_seq_lens = batch.seq_lens + 1
        if on_publish is not None:
            on_publish(new_seq_lens)
        out = self.verify_phase.plain_decode(batch, bonus, seq_lens)
        self.history.write_step(batch.req_pool_indices, batch.seq_lens, out.next_token_ids.unsqueeze(1))
        clock.mark("verify")
        zeros = [0] * len(rids)
        self.policy.observe(rids, zeros, zeros)
        seconds = time.perf_counter() - started
        accept_lens = torch.ones_like(batch.seq_lens, dtype=torch.int32)
        next_state = FaserDraftState(draft_kv_lens, bonus_tokens=out.next_token_ids)
        if self.ahead is not None and drafts_ahead(batch):
            ranges.begin("ahead")
            next_lengths = self._choose_ahead(batch, rids, context, zeros, draft_kv_lens)
            if any(next_lengths):
                sampling = SamplingRows.from_sampling_info(
                    batch.sampling_info, self.server_args.sampling_backend, batch.reqs
                )
                next_state.ahead = self._draft_ahead(
                    batch, sampling, context, zeros, draft_kv_lens, next_lengths, accept_lens, new_seq_lens, clock
                )
            else:  # the next step decodes plainly too, and need not choose again
                next_state.ahead = AheadDrafts.none(len(rids), self.k_max, batch.seq_lens.device)
            self._fence.after_queued_work()
        kind = "plain+chain" if next_state.ahead is not None and any(next_state.ahead.lengths) else "plain"
        self.stats.record(rids, seq_lens, draft_kv_lens, zeros, zeros, seconds, clock, kind)
        return GenerationBatchResult(
            logits_output=out.logits_output,
            next_token_ids=out.next_token_ids,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=next_state,
            speculative_num_draft_tokens=1,
            can_run_cuda_graph=out.can_run_cuda_graph,
        )

    def _note_batch(self, rids: list[str]) -> None:
        """Forget the policy state of requests no decode step has carried for
        FORGET_AFTER_STEPS steps (swept every FORGET_AFTER_STEPS steps). SGLang
        reports a finish only from decode results; under the overlap schedule a
        request that finishes at its prefill (one token, or a stop at the first
        token) still rides the next decode step, is observed there, and is never
        reported."""
        self._decode_steps += 1
        for rid in rids:
            self._last_seen[rid] = self._decode_steps
        if self._decode_steps % FORGET_AFTER_STEPS:
            return
        horizon = self._decode_steps - FORGET_AFTER_STEPS
        for rid in [r for r, step in self._last_seen.items() if step <= horizon]:
            del self._last_seen[rid]
            self.policy.forget(rid)

    def _settle(self) -> None:
        """Feed the last drafting step's acceptance to the policy and the statistics.

        Under the overlap schedule this runs when the next decode step starts, or when
        a request finishes and the step is complete; synchronously, right after the step."""
        step, self._pending = self._pending, None
        if step is None:
            return
        accepted = [a - 1 for a in step.accept_lens()]
        live = [i for i, rid in enumerate(step.rids) if rid not in step.finished]
        self.policy.observe([step.rids[i] for i in live], [step.lengths[i] for i in live], [accepted[i] for i in live])
        self.stats.record(
            step.rids, step.seq_lens, step.draft_kv_lens, step.lengths, accepted, step.seconds, step.clock, step.kind
        )

    def _result(
        self,
        batch: ScheduleBatch,
        result: AcceptResult,
        accept_lens: torch.Tensor,  # [bs] int32
        logits: torch.Tensor,  # [bs, K+1, V]
        new_seq_lens: torch.Tensor,  # [bs]
        next_state: FaserDraftState,
    ) -> GenerationBatchResult:
        bs, width = result.tokens.shape
        predict = result.tokens.reshape(-1)  # [bs * (K+1)], row i at i * (K+1)
        logits_output = LogitsProcessorOutput(next_token_logits=logits.reshape(bs * width, -1))
        if batch.return_logprob:
            accept_index = torch.arange(bs * width, device=predict.device).view(bs, width)
            compute_spec_v2_logprobs(batch, logits_output, predict, accept_index, self.k_max)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=predict,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=next_state,
            speculative_num_draft_tokens=width,
            can_run_cuda_graph=self.verify_phase.chunks.graphed,  # SGLang logs it per decode batch
        )


@dataclass
class PendingStep:
    """A drafting step whose acceptance the host reads later (``FaserWorker._settle``)."""

    rids: list[str]
    seq_lens: list[int]
    draft_kv_lens: list[int]
    lengths: list[int]
    seconds: float
    clock: PhaseClock
    kind: str  # metrics.STEP_KINDS
    copy: torch.Tensor  # [bs] int accept lengths, on the host once ``done`` fires
    done: Optional[torch.cuda.Event]  # None: ``copy`` is already complete (no CUDA)
    finished: set[str] = field(default_factory=set)  # rids forgotten before settling

    @classmethod
    def of(
        cls, rids, seq_lens, draft_kv_lens, lengths, accept_lens: torch.Tensor, started: float, clock, kind: str
    ) -> "PendingStep":
        seconds = time.perf_counter() - started
        if accept_lens.device.type != "cuda":
            return cls(rids, seq_lens, draft_kv_lens, lengths, seconds, clock, kind, accept_lens.cpu(), None)
        copy = torch.empty(accept_lens.shape, dtype=accept_lens.dtype, pin_memory=True)
        copy.copy_(accept_lens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return cls(rids, seq_lens, draft_kv_lens, lengths, seconds, clock, kind, copy, done)

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def accept_lens(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()
        return self.copy.tolist()


def cap_to_remaining(lengths: list[int], remaining: Sequence[Optional[int]]) -> list[int]:
    """Cap each draft length so that a request only reaches max_new_tokens in a
    one-token step.

    SGLang checks a multi-token step's length limit before its stop strings and stop
    tokens, so a step that crossed the limit with a stop inside it would finish on
    length with the stop text kept, unlike plain decoding. A step emits at most k + 1
    tokens; with k <= remaining - 2 it stays short of the limit, and the last token
    before the limit comes from a plain (k = 0) step (policy.draft_caps, which the
    adaptive policy prices with). ``remaining``: remaining_tokens.
    """
    return [min(k, cap) for k, cap in zip(lengths, draft_caps(remaining, max(lengths, default=0)))]


def remaining_tokens(reqs, seq_lens: Sequence[int]) -> list[Optional[int]]:
    """[bs] tokens each request may still emit besides the bonus token it holds (None: no
    max_new_tokens). A request has emitted seq_len + 1 - prompt tokens, the bonus
    included, counted from the committed length because under the overlap schedule
    ``req.output_ids`` lags a step."""
    left: list[Optional[int]] = []
    for req, n in zip(reqs, seq_lens):
        limit = req.sampling_params.max_new_tokens
        left.append(None if limit is None else limit - (n + 1 - len(req.origin_input_ids)))
    return left


def fit_token_budget(lengths: list[int], budget: Optional[int]) -> list[int]:
    """Shorten the longest drafts until the step verifies at most ``budget`` tokens
    (sum of k_i + 1), so the verify replays from CUDA graphs instead of falling back to
    an eager forward that costs more than the cut drafts could bring. A batch larger
    than the budget verifies eagerly whatever the lengths, and is left alone. The
    adaptive policy prices the budget itself (``StepContext.max_verify_tokens``); for
    the others this is where their lengths meet it.

    lengths [5, 1, 3, 0], budget 10 (room for 6 drafts): cap 2 -> [2, 1, 2, 0], and the
    one spare draft goes back to the first row that was cut -> [3, 1, 2, 0].
    """
    room = draft_room(len(lengths), budget)
    if room is None or sum(lengths) <= room:
        return list(lengths)
    cap = max(lengths)
    while sum(min(k, cap) for k in lengths) > room:
        cap -= 1
    spare = room - sum(min(k, cap) for k in lengths)
    fitted = []
    for k in lengths:
        extra = 1 if spare > 0 and k > cap else 0
        spare -= extra
        fitted.append(min(k, cap) + extra)
    return fitted


def _without_spec_info(batch: ScheduleBatch) -> ScheduleBatch:
    view = copy.copy(batch)
    view.spec_info = None
    return view
