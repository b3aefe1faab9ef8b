"""Draft phase: propose k_i tokens for every request with a separate draft model.

Only requests with k_i > 0 run. Each one's draft KV may lag its committed length L_i
by g_i tokens (it accepted every draft last step, or did not draft), and its bonus
token at position L_i has no draft KV yet; drafting feeds those first. m = max(k_i).

- Steps with m > 1 run as one chain (draft_chain.py: one multi-step attention plan
  and, where decode CUDA graphs run, one graph replay), every drafting row to m; a
  sampling row keeps each draft's distribution q for rejection sampling, and a logit
  bias is added at every forward (chain_sampling.py). When every g_i <= MAX_FORCED_GAP
  the chain itself feeds the missing tokens and the bonus token before drafting: the
  step's whole draft phase is one replay. Otherwise a catch-up (below) gives d1 and
  the chain drafts d2..d_m.
- Otherwise (m = 1, no chains, or no sampled chains for sampling or biased rows) a
  catch-up (chunk_forward.py: one EXTEND forward, or decode rows, up to
  MAX_CATCHUP_PIECES forwards of them) feeds the missing committed tokens plus the
  bonus token and its last logits give d1; then one DECODE forward per draft step,
  each over only the requests that still want more, keeping each draft's q when the
  step samples.

Worked example, K_max = 3, seq_lens L = [10, 7], draft_kv_lens s = [9, 7], k = [3, 1],
gaps g = [1, 0]: one chain of max(g) + m = 4 forwards,
  row 0 feeds 9 (committed), 10 (bonus), d1 at 11, d2 at 12  -> draws 1..3 = d1..d3
  row 1 feeds 7 (bonus), d1 at 8, d2 at 9, d3 at 10          -> draw 0 = d1
  new draft_kv_lens = [L0 + 3, L1 + 3] = [13, 10] (valid until verify trims them)
Without chains, the same rows run a catch-up (row 0 feeds 9..10, row 1 feeds 7 -> d1
for both), then row 0 alone d1 at 11 -> d2 and d2 at 12 -> d3: [L0 + 3, L1 + 1] =
[13, 8].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch

from faser_sglang.layout import RaggedLayout
from faser_sglang.metrics import annotate
from faser_sglang.spec_worker.batch_views import ChunkTokens, decode_forward_batch, request_pool_rows
from faser_sglang.spec_worker.chunk_forward import ChunkForward
from faser_sglang.spec_worker.draft_chain import MAX_FORCED_GAP, DraftChains
from faser_sglang.spec_worker.policy import MAX_CATCHUP_PIECES
from faser_sglang.spec_worker.sampling import (
    SamplingRows,
    biased_requests,
    greedy_requests,
    greedy_tokens,
    plain_rows,
    sampling_probs,
)
from faser_sglang.spec_worker.token_history import TokenHistory
from faser_sglang.tensors import device_tensor


@dataclass(frozen=True)
class DraftOutput:
    tokens: torch.Tensor  # [bs, K_max] int64, zero past each row's k_i
    probs: Optional[torch.Tensor]  # [bs, K_max, V] float32 q of each draft; None if all greedy
    draft_kv_lens: list[int]  # [bs] draft KV fill after this phase
    catchup_forwards: int  # forwards of a catch-up of its own (0: none; a chain fed it, or nobody drafted)
    # How the draft forwards ran: "none" (a catch-up alone: no row drafts past d1),
    # "loop" (one forward per draft step), "chain" (one multi-step plan, eager forwards)
    # or "graph" (one CUDA graph replay); a chain includes the catch-up when
    # catchup_forwards is 0 (draft_chain.py).
    steps: str = "loop"


class DraftPhase:
    def __init__(self, chunks: ChunkForward, k_max: int, vocab_size: int):
        self.chunks = chunks
        self.runner = chunks.runner
        self.req_to_token_pool = chunks.req_to_token_pool
        self.k_max = k_max
        self.vocab_size = vocab_size
        # Set once the draft's CUDA graphs are captured (FaserWorker.init_cuda_graphs);
        # None: every step drafts one forward at a time.
        self.chains: Optional[DraftChains] = None

    def chains_batch(self, reqs, sampling_info) -> bool:
        """Whether a step over this batch (its requests and SGLang's SamplingBatchInfo)
        runs its draft forwards as one chain, as ``run`` decides for its drafting rows.
        Greedy is judged per request, as ``SamplingRows`` does (SGLang's
        ``is_all_greedy`` is not recomputed when a batch is filtered), and the batch's
        size stands for its drafting rows: where sampling rows chain only up to a size
        (DraftChains.serves), a batch that drafts fewer rows than it has, or only its
        greedy ones, may chain where the policy priced one forward per step."""
        return self._chains_serve(len(reqs), all(greedy_requests(reqs)) and not any(biased_requests(reqs)))

    def _chains_serve(self, rows: int, plain: bool) -> bool:
        """Chains are built and serve these rows (DraftChains.serves); rows that are not
        ``plain`` (greedy, unbiased) need the sampled chains, which sample and add the
        logit bias at every forward."""
        return self.chains is not None and self.chains.serves(rows, plain)

    def run(
        self,
        batch: ScheduleBatch,
        layout: RaggedLayout,
        draft_kv_lens: Sequence[int],
        sampling: SamplingRows,
        generator: Optional[torch.Generator],
        history: TokenHistory,
    ) -> DraftOutput:
        device = batch.seq_lens.device
        bs = layout.batch_size
        k = layout.draft_lens_cpu
        seq_lens = batch.seq_lens_cpu.tolist()
        tokens = torch.zeros((bs, self.k_max), dtype=torch.int64, device=device)
        probs = None
        if not sampling.all_greedy:
            probs = torch.zeros((bs, self.k_max, self.vocab_size), dtype=torch.float32, device=device)
        new_kv_lens = list(draft_kv_lens)
        active = [i for i in range(bs) if k[i] > 0]
        if not active:
            return DraftOutput(tokens, probs, new_kv_lens, 0)

        m = max(k[i] for i in active)
        plain = plain_rows(sampling, batch.reqs, active)
        chained = m > 1 and self._chains_serve(len(active), plain)
        gaps = [seq_lens[i] - draft_kv_lens[i] for i in active]  # committed tokens each row's draft KV lacks
        forwards = 0
        active_t = device_tensor(active, device) if chained else None
        rows = None if plain or not chained else sampling.select(active, active_t)  # a sampled chain's rows
        chain_q = None  # [n, m, V] a sampled chain's q
        if chained and max(gaps) <= MAX_FORCED_GAP:
            with annotate("draft.chain"):
                chain, chain_q = self._chain_from_committed(
                    batch, active, seq_lens, gaps, history, m, rows, generator
                )  # [n, m]
        else:
            with annotate("draft.catchup"):
                logits, forwards = self._catch_up(batch, active, seq_lens, draft_kv_lens, history)  # [n, V]
            if chained:
                with annotate("draft.chain"):
                    chain, chain_q = self._chain_after(batch, active, seq_lens, logits, m, rows, generator)
            else:
                with annotate("draft.loop" if m > 1 else "draft.first"):
                    self._loop(batch, layout, active, seq_lens, logits, sampling, generator, tokens, probs)
        if chained:
            past_len = torch.arange(m, device=device).unsqueeze(0) >= layout.draft_lens[active_t].unsqueeze(1)
            tokens[active_t, :m] = chain.masked_fill(past_len, 0)
            if chain_q is not None:  # q past a row's length is never read
                probs[active_t, :m] = chain_q
        for i in active:
            # A chain feeds every row through position L + m - 1 (draft_chain.py), a loop
            # row through L + k_i - 1; verify trims either to what it accepts (state.py).
            new_kv_lens[i] = seq_lens[i] + (m if chained else k[i])
        steps = "none" if m == 1 else "loop"
        if chained:
            steps = "graph" if self.chains.graphed(len(active), sampled=rows is not None) else "chain"
        return DraftOutput(tokens, probs, new_kv_lens, forwards, steps)

    def catch_up_ahead(
        self,
        batch: ScheduleBatch,
        rows: list[int],  # rows that drafted nothing this step (draft_ahead.rows_to_catch_up)
        seq_lens: Sequence[int],  # [bs] this step's committed lengths L
        draft_kv_lens: Sequence[int],  # [bs] draft KV fill after this step's draft phase
        history: TokenHistory,
    ) -> list[int]:
        """At the end of a step, feed ``rows`` the committed tokens their draft KV lacks
        and this step's bonus token (positions b .. L; the history holds them), so a
        chain drafted ahead starts them at L + 1, their next committed length: the [bs]
        draft KV fill after it."""
        self._catch_up(batch, rows, list(seq_lens), draft_kv_lens, history)
        caught_up = set(rows)
        return [n + 1 if i in caught_up else d for i, (n, d) in enumerate(zip(seq_lens, draft_kv_lens))]

    def _chain_from_committed(
        self,
        batch: ScheduleBatch,
        active: list[int],
        seq_lens: list[int],
        gaps: list[int],  # [n] committed tokens each row's draft KV lacks, <= MAX_FORCED_GAP
        history: TokenHistory,
        m: int,
        rows: Optional[SamplingRows],  # [n] the rows' sampling; None: greedy, unbiased
        generator: Optional[torch.Generator],
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """[n, m] drafts d1..d_m (and [n, m, V] their q when ``rows`` sample) from one
        chain that first feeds each row its missing committed tokens and its bonus
        token (positions L - g .. L)."""
        widest = max(gaps)
        pool = request_pool_rows(batch)
        pool_rows = [pool[i] for i in active]
        # Row r's forced inputs: positions L_r - g_r .. L_r, then (unread) repeats of L_r.
        positions = [seq_lens[i] - g + min(j, g) for i, g in zip(active, gaps) for j in range(widest + 1)]
        forced = history.gather([r for r in pool_rows for _ in range(widest + 1)], positions)
        forced = forced.view(len(active), widest + 1)
        starts = [seq_lens[i] - g for i, g in zip(active, gaps)]
        return self.chains.run(
            pool_rows, starts, gaps, forced, widest + m, m, rows, generator
        )  # row r's d1 is its draw g_r

    def _chain_after(
        self,
        batch: ScheduleBatch,
        active: list[int],
        seq_lens: list[int],
        logits: torch.Tensor,  # [n, V] the catch-up's last logits
        m: int,
        rows: Optional[SamplingRows],  # [n] the rows' sampling; None: greedy, unbiased
        generator: Optional[torch.Generator],
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """[n, m] drafts (and [n, m, V] their q when ``rows`` sample): d1 from the
        catch-up's logits, d2..d_m from a chain fed d1 at position L + 1."""
        if rows is None:
            first = _Picked(torch.argmax(logits, dim=-1), None)  # a greedy chain's rows are unbiased
        else:
            first = self._pick(logits, rows, generator)
        pool = request_pool_rows(batch)
        after, after_q = self.chains.run(
            [pool[i] for i in active], [seq_lens[i] + 1 for i in active], [0] * len(active),
            first.tokens.unsqueeze(1), m - 1, m - 1, rows, generator,
        )  # fmt: skip
        tokens = torch.cat([first.tokens.unsqueeze(1), after], dim=1)
        if after_q is None:  # no row samples (a greedy batch, biased or not)
            return tokens, None
        return tokens, torch.cat([first.probs.unsqueeze(1), after_q], dim=1)

    def _loop(
        self,
        batch: ScheduleBatch,
        layout: RaggedLayout,
        active: list[int],
        seq_lens: list[int],
        logits: torch.Tensor,  # [len(active), V] the catch-up's last logits
        sampling: SamplingRows,
        generator: Optional[torch.Generator],
        tokens: torch.Tensor,  # [bs, K_max] filled here
        probs: Optional[torch.Tensor],  # [bs, K_max, V] filled here when sampling
    ) -> None:
        """One forward per draft step, each over the rows that still want a draft."""
        device = batch.seq_lens.device
        k = layout.draft_lens_cpu
        rows = active
        for step in range(max(k[i] for i in active)):
            rows_t = device_tensor(rows, device)
            picked = self._pick(logits, sampling.select(rows, rows_t), generator)
            tokens[rows_t, step] = picked.tokens
            if probs is not None and picked.probs is not None:
                probs[rows_t, step] = picked.probs
            # Rows that want another draft feed this one at position L + step + 1.
            keep = [j for j, i in enumerate(rows) if k[i] > step + 1]
            if not keep:
                break
            rows = [rows[j] for j in keep]
            keep_t = device_tensor(keep, device)
            logits = self._decode(batch, rows, seq_lens, step + 1, picked.tokens[keep_t])

    def _catch_up(
        self,
        batch: ScheduleBatch,
        active: list[int],
        seq_lens: list[int],
        draft_kv_lens: Sequence[int],
        history: TokenHistory,
    ) -> tuple[torch.Tensor, int]:
        """Feed each active row its missing committed tokens and bonus token: its last
        logits [len(active), V], and the forwards that took."""
        starts = [draft_kv_lens[i] for i in active]
        lens = [seq_lens[i] + 1 - draft_kv_lens[i] for i in active]  # committed gap + bonus
        tokens = ChunkTokens.of(batch, active, starts, lens)
        logits = self.chunks.logits(
            batch, active, starts, lens, history.at(tokens), last_only=True, max_pieces=MAX_CATCHUP_PIECES,
            tokens=tokens,
        )  # fmt: skip
        return logits, self.chunks.forwards(sum(lens), MAX_CATCHUP_PIECES)

    def _decode(
        self,
        batch: ScheduleBatch,
        rows: list[int],
        seq_lens: list[int],
        offset: int,
        input_ids: torch.Tensor,  # [len(rows)]
    ) -> torch.Tensor:
        tokens = ChunkTokens.of(batch, rows, [seq_lens[i] + offset for i in rows], [1] * len(rows))
        seq_lens_cpu, seq_lens_t = tokens.decode_lengths()
        fb = decode_forward_batch(
            batch,
            self.runner,
            sel=tokens.selection(),
            input_ids=input_ids,
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=tokens.kv_slots(self.req_to_token_pool.req_to_token),
            seq_lens=seq_lens_t,
        )
        return self.runner.forward(fb).logits_output.next_token_logits

    @staticmethod
    def _pick(
        logits: torch.Tensor, sampling: SamplingRows, generator: Optional[torch.Generator]
    ) -> "_Picked":
        if sampling.all_greedy:
            return _Picked(greedy_tokens(logits, sampling), None)
        q = sampling_probs(logits, sampling)  # [n, V]
        sampled = torch.multinomial(q, 1, generator=generator).squeeze(1)
        tokens = torch.where(sampling.greedy, greedy_tokens(logits, sampling), sampled)
        return _Picked(tokens, q)


@dataclass(frozen=True)
class _Picked:
    tokens: torch.Tensor  # [n] int64
    probs: Optional[torch.Tensor]  # [n, V] float32
