"""Drafting ahead: the next step's draft chain, queued right behind this step's acceptance.

A drafting step's host work before the target's launch (the policy, the chain's plan
and graph launch, the verify's preparation: ~10 ms on an H200 with the 13.5B pair)
leaves the GPU idle, because the step's lengths only exist once the previous step's
acceptance has reached the host. With ``draft_ahead`` the chain of step N + 1 is
queued at the end of step N, on the device, behind the accept kernels; the host does it
while the GPU still runs step N's verify. Step N + 1 then only verifies: its host work
before the target's launch is the verify's preparation.

What the host does not know at that point, and how the chain does without it:
- the lengths k' of step N + 1: the policy chooses them at the end of step N, for the
  same requests, from committed lengths bounded by L + k + 1 (all drafts accepted;
  ``predicted_context``). Its acceptance windows then lack step N's verdicts: one step
  staler than a step that chooses at its own start.
- each row's start and forced tokens: row i committed L'_i = L_i + a_i + 1 tokens, and
  its draft KV is valid up to min(b_i, L'_i) with b_i = L_i + e_i the step's draft KV
  bound, so it lags g_i = max(0, a_i + 1 - e_i) committed tokens, at most max(0, k_i + 1 - e_i).
  The device computes g_i and s_i = L'_i - g_i from the accept lengths; the host only
  needs the bound G = max g_i <= MAX_FORCED_GAP for the chain's M = G + max k' forwards.
  A row that drafted this step lags at most one token (the chain fed it to the step's
  longest draft). One that did not (k_i = 0: back after plain steps, or a lazily
  prefilled request's first draft) may lag by many, but its L'_i = L_i + 1 is known to
  the host, so before the chain a catch-up with host lengths feeds it positions
  b_i .. L_i (``rows_to_catch_up``) and it starts the chain with no gap.
- attention over lengths the host lacks: a multi-step backend that plans with kernels
  (Triton's; on the CPU the device's lengths are the host's). FlashInfer's is planned
  from host lengths, so ``draft_ahead`` needs ``--speculative-draft-attention-backend
  triton`` on a GPU (validation.py).

A plain step N (every k_i = 0, one token each) drafts ahead the same way; its
prediction is exact (L'_i = L_i + 1), and where the policy drafts nothing next it hands
step N + 1 that choice (``AheadDrafts.none``) rather than have it choose again.

Where step N + 1 differs from what step N drafted for, the drafts still hold: a request
that finished is filtered out with its drafts (FaserDraftState), one that joined has
none and verifies one token (k = 0), and the step may only shorten the lengths
(max_new_tokens, the verify's token budget). Rows that sample or carry a logit bias
draft through the sampled chains (chain_sampling.py), whose q of each draft the drafts
carry to the next step's rejection sampling. A step that cannot use them (a request
joined that wants logprobs) drafts as usual: the KV the chain wrote is valid where it
holds committed tokens and is rewritten before it is read elsewhere.
The chain may also write for a request that has just finished (its stop token was in
step N) and whose KV SGLang frees while the chain is still queued: it writes draft KV
only, and a later owner of those slots writes theirs in a forward queued behind it.

Ordering against the scheduler: SGLang's scheduler orders its own device work after
a step (filtering and merging the batch's tensors, writing ``req_to_token`` for the next
step's slots and new requests) behind an event the step's last reader of shared buffers
records (the WAR barrier, ``BaseSpecWorker.war_fastpath_runner``); by default the
target's decode graph records it just before its replay. Work queued after the target
(the catch-up, the chain, the drafts' tensors) would then race the scheduler: a batch
filter could copy drafts not yet written, and a request-pool row freed and handed to a
new request could have its ``req_to_token`` rewritten before a chain for its last owner
reads it. ``ReadFence`` moves the event behind that work.

KV: the chain writes draft KV up to position L'_i - g_i + M - 1 <= L_i + 2 K_max +
MAX_FORCED_GAP, past the 2 (K_max + 1) tokens SGLang reserves beyond a committed length
that lags L_i by up to K_max + 1 under the overlap schedule. ``reserve_per_decode``
(kv_reserve.py, a HookRegistry hook) raises the reservation to ``ahead_reserve(K_max)``
for a FASER server that drafts ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from faser_sglang.kv_reserve import MAX_FORCED_GAP
from faser_sglang.spec_worker.batch_views import request_pool_rows
from faser_sglang.spec_worker.draft_chain import DraftChains
from faser_sglang.spec_worker.policy import StepContext
from faser_sglang.spec_worker.sampling import SamplingRows, plain_rows
from faser_sglang.spec_worker.token_history import TokenHistory
from faser_sglang.tensors import device_tensor


@dataclass
class AheadDrafts:
    """A step's drafts, drafted at the end of the step before (rows of the batch)."""

    tokens: torch.Tensor  # [bs, K_max] int64, zero past each row's length
    probs: Optional[torch.Tensor]  # [bs, K_max, V] float32 q of a sampled chain's drafts; None: no row sampled
    lengths: list[int]  # [bs] k' the policy chose (0: not drafted ahead)
    fed: list[int]  # [bs] e: the chain left the row's draft KV valid up to L' + e (0: not fed)

    def filter(self, keep: torch.Tensor, keep_cpu: Sequence[int]) -> None:
        self.tokens = self.tokens[keep]
        self.probs = None if self.probs is None else self.probs[keep]
        self.lengths = [self.lengths[i] for i in keep_cpu]
        self.fed = [self.fed[i] for i in keep_cpu]

    @classmethod
    def merged(
        cls, a: Optional["AheadDrafts"], a_rows: int, b: Optional["AheadDrafts"], b_rows: int
    ) -> Optional["AheadDrafts"]:
        """The drafts of batch a followed by batch b; rows of a batch without any have none."""
        if a is None and b is None:
            return None
        like = a if a is not None else b
        k_max, device = like.tokens.shape[1], like.tokens.device
        a = a or cls.none(a_rows, k_max, device)
        b = b or cls.none(b_rows, k_max, device)
        probs = None
        if a.probs is not None or b.probs is not None:
            probs = torch.cat([_q_or_zeros(a, b), _q_or_zeros(b, a)])
        return cls(torch.cat([a.tokens, b.tokens]), probs, a.lengths + b.lengths, a.fed + b.fed)

    @classmethod
    def none(cls, rows: int, k_max: int, device) -> "AheadDrafts":
        """k' = 0 for every row: no drafts (where the next step decodes plainly, the
        choice a plain step hands it)."""
        return cls(torch.zeros((rows, k_max), dtype=torch.int64, device=device), None, [0] * rows, [0] * rows)


def _q_or_zeros(drafts: AheadDrafts, other: AheadDrafts) -> torch.Tensor:
    """[rows, K_max, V] the q of ``drafts``, zeros (no row drafted there samples) if it has none."""
    if drafts.probs is not None:
        return drafts.probs
    return other.probs.new_zeros((drafts.tokens.shape[0], *other.probs.shape[1:]))


class ReadFence:
    """What SGLang's scheduler asks for the event its WAR barrier waits on
    (``war_fastpath_read_done_event``, read and then cleared after every step): the
    event ``after_queued_work`` recorded this step, or else the target runner's own
    (its decode graph's, recorded before the replay; None: the scheduler waits for the
    whole forward stream)."""

    def __init__(self, target_runner, device: str):
        self._target_runner = target_runner
        self._events = torch.get_device_module(device)
        self._event = None

    @property
    def war_fastpath_read_done_event(self):
        return self._event if self._event is not None else self._target_runner.war_fastpath_read_done_event

    @war_fastpath_read_done_event.setter
    def war_fastpath_read_done_event(self, event) -> None:
        self._event = event
        self._target_runner.war_fastpath_read_done_event = event

    def step_began(self) -> None:
        """Forget an event no barrier took (one recorded earlier in the stream is weaker
        than this step's)."""
        self._event = None

    def after_queued_work(self) -> None:
        """Record, on the current (forward) stream, the point after the work this step
        queued behind its target forward."""
        event = self._events.Event()
        event.record()
        self._event = event


def drafts_ahead(batch) -> bool:
    """Whether a step over this batch drafts ahead: every request but one that wants
    logprobs (whose verify takes the general path)."""
    return not batch.return_logprob


def upper_seq_lens(seq_lens: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """[bs] the next step's committed lengths if every draft of this step is accepted:
    L + k + 1, an upper bound."""
    return [n + k + 1 for n, k in zip(seq_lens, lengths)]


def predicted_context(
    context: StepContext,
    seq_lens: Sequence[int],  # [bs] upper_seq_lens of this step
    kv_bound: Sequence[int],  # [bs] draft KV bound after this step's draft phase
    remaining: Sequence[Optional[int]],  # [bs] at ``seq_lens`` (worker.remaining_tokens)
) -> StepContext:
    """The next step's context as far as this step knows it: every draft accepted, so
    committed lengths are upper bounds and remaining tokens lower bounds (the caps they
    give are never looser than the next step's own)."""
    return StepContext(
        tuple(seq_lens),
        tuple(min(b, n) for b, n in zip(kv_bound, seq_lens)),
        context.max_verify_tokens,
        context.catchup_piece_tokens,
        tuple(remaining),
        context.chained,
    )


def forced_gap_bounds(lengths: Sequence[int], seq_lens: Sequence[int], kv_bound: Sequence[int]) -> list[int]:
    """[bs] the most committed tokens each row's draft KV can lag after this step:
    g_i = max(0, a_i + 1 - e_i) with e_i = b_i - L_i and a_i <= k_i accepted drafts.

    k [3, 1, 0], L [10, 10, 10], b [13, 13, 10] -> [1, 0, 1]"""
    return [max(0, k + 1 - (b - n)) for k, n, b in zip(lengths, seq_lens, kv_bound)]


def rows_to_catch_up(
    lengths: Sequence[int], seq_lens: Sequence[int], kv_bound: Sequence[int], next_lengths: Sequence[int]
) -> list[int]:
    """Rows the next step drafts whose draft KV could lag it by more than
    MAX_FORCED_GAP (a request back after plain steps, a lazily prefilled one's first
    draft). Each drafted nothing this step (a drafting row lags at most one token, see
    ``forced_gap_bounds``), so its next committed length is L + 1, known here, and its
    catch-up (positions b .. L: the committed tokens its draft lacks and this step's
    bonus) can run before the chain (DraftPhase.catch_up_ahead), leaving it no gap.

    k [0, 0, 3, 0], k' [2, 2, 2, 0], L [10, 10, 10, 10], b [10, 7, 13, 5] -> [1]"""
    gaps = forced_gap_bounds(lengths, seq_lens, kv_bound)
    return [
        i
        for i, (k, k_next, g) in enumerate(zip(lengths, next_lengths, gaps))
        if k == 0 and k_next > 0 and g > MAX_FORCED_GAP
    ]


class DraftAhead:
    """Launches the next step's chain (``launch``) and hands its drafts to the step
    (``drafts_for``)."""

    def __init__(self, chains: DraftChains, history: TokenHistory, k_max: int, vocab_size: int):
        self.chains = chains
        self.history = history
        self.k_max = k_max
        self.vocab_size = vocab_size

    def launch(
        self,
        batch,
        sampling: SamplingRows,  # [bs] the batch's sampling
        generator: Optional[torch.Generator],
        seq_lens: Sequence[int],  # [bs] this step's committed lengths
        lengths: Sequence[int],  # [bs] this step's k
        kv_bound: Sequence[int],  # [bs] draft KV bound after this step's draft phase
        next_lengths: Sequence[int],  # [bs] k' the policy chose for the next step
        accept_lens: torch.Tensor,  # [bs] this step's accepted drafts + 1, on the device
        new_seq_lens: torch.Tensor,  # [bs] L' on the device
        catch_up: Callable[[list[int], Sequence[int]], Sequence[int]],  # (rows, kv_bound) -> kv_bound after
    ) -> Optional[AheadDrafts]:
        """Queue the next step's chain, first catching up the rows ``rows_to_catch_up``
        names; None where it cannot run ahead (no row drafts, a row still lags more than
        MAX_FORCED_GAP, or no chain serves the rows from the device's lengths). Rows
        that sample or carry a logit bias draft through the sampled chain, which keeps
        each draft's q for the next step's rejection sampling."""
        rows = [i for i, k in enumerate(next_lengths) if k > 0]
        if not rows:
            return None
        plain = plain_rows(sampling, batch.reqs, rows)
        n = len(rows)
        if not self.chains.serves(n, plain) or not self.chains.plans_on_device(n, sampled=not plain):
            return None
        behind = rows_to_catch_up(lengths, seq_lens, kv_bound, next_lengths)
        if behind:
            kv_bound = catch_up(behind, kv_bound)
        gaps_bound = forced_gap_bounds(lengths, seq_lens, kv_bound)
        widest = max(gaps_bound[i] for i in rows)
        if widest > MAX_FORCED_GAP:  # its catch-up runs in the next step itself
            return None
        m = max(next_lengths[i] for i in rows)
        device = new_seq_lens.device
        pool = request_pool_rows(batch)
        packed = device_tensor(
            [*rows, *(pool[i] for i in rows), *(kv_bound[i] - seq_lens[i] for i in rows),
             *(next_lengths[i] for i in rows)],
            device,
        ).view(4, n)  # fmt: skip
        rows_t, pool_t, extent_t, lens_t = packed
        gaps = (accept_lens[rows_t].to(torch.int64) - extent_t).clamp(min=0)  # [n]
        starts = new_seq_lens[rows_t].to(torch.int64) - gaps  # [n]
        cols = torch.arange(widest + 1, device=device)
        positions = starts.unsqueeze(1) + torch.minimum(cols.unsqueeze(0), gaps.unsqueeze(1))  # [n, G + 1]
        forced = self.history.read(pool_t.unsqueeze(1), positions)  # [n, G + 1]
        row_sampling = None if plain else sampling.select(rows, rows_t)
        chain, q = self.chains.run_ahead(
            pool_t, starts, gaps, forced, widest + m, m, row_sampling, generator
        )  # [n, m], [n, m, V] or None
        bs = len(next_lengths)
        tokens = torch.zeros((bs, self.k_max), dtype=torch.int64, device=device)
        past = torch.arange(m, device=device).unsqueeze(0) >= lens_t.unsqueeze(1)  # [n, m]
        tokens[rows_t, :m] = chain.masked_fill(past, 0)
        probs = None
        if q is not None:  # q past a row's length is never read
            probs = torch.zeros((bs, self.k_max, q.shape[2]), dtype=torch.float32, device=device)
            probs[rows_t, :m] = q
        return AheadDrafts(tokens, probs, list(next_lengths), [m if k > 0 else 0 for k in next_lengths])

    def drafts_for(
        self,
        ahead: AheadDrafts,
        draft_lens: torch.Tensor,  # [bs] the step's final k (never above ahead.lengths)
        sampling: SamplingRows,  # [bs] the step's sampling
        seq_lens: Sequence[int],  # [bs] the step's committed lengths
        draft_kv_lens: Sequence[int],  # [bs] valid draft KV before the chain ran ahead
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], list[int]]:
        """The step's [bs, K_max] drafts, zero past its final lengths; their [bs, K_max, V]
        q where some row samples (None where every row is greedy; zeros for sampling rows
        that joined since: they draft nothing); and its draft KV bound: L + e where the
        chain fed the row."""
        cols = torch.arange(self.k_max, device=draft_lens.device).unsqueeze(0)
        tokens = ahead.tokens.masked_fill(cols >= draft_lens.unsqueeze(1), 0)
        probs = None
        if not sampling.all_greedy:
            probs = ahead.probs
            if probs is None:
                probs = torch.zeros((*tokens.shape, self.vocab_size), dtype=torch.float32, device=tokens.device)
        bound = [n + e if e > 0 else d for n, e, d in zip(seq_lens, ahead.fed, draft_kv_lens)]
        return tokens, probs, bound
