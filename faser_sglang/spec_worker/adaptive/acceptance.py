"""Per-request acceptance estimates from a sliding window of verify steps.

What is estimated: alpha_j = P(draft j accepted | drafts 0..j-1 accepted), per request
and per draft position j. Acceptance is a prefix, so one verify of k drafts with a
accepted says: positions 0..a-1 succeeded, position a failed (only if a < k), and
positions past a were not tested. Each position therefore keeps its own counts
(successes, trials), and

    alpha_j = (successes_j + m * prior_j) / (trials_j + m)

is the mean of a Beta posterior whose prior has weight m (``prior_strength``)
centred on prior_j. The prior is pooled over the latest ``pool_size`` drafting
verifies of *all* requests (including finished ones), itself smoothed toward a
base rate with weight m_pool (``pool_prior_strength``), so a new request starts
from what the current traffic looks like and a position a request has not drafted
lately falls back to it.

Why m_pool is a batch's worth of verifies (8), not m (2): the pool is everyone's
prior, and at the start, or after a peak in which nobody drafted, it holds only the
first drafting batch. With m_pool = 2, four requests whose first drafts were rejected
3 times in 4 at position 0 (true acceptance 0.61; it happens about one start in five)
pulled the prior to 0.4, below what drafting needs, and drafting stayed off until
those four verifies aged out of the pool, hundreds of steps later: simulated on the
13.5B pair's profile at 4 requests, 0.99x plain instead of 1.13x. With m_pool = 8
the same start leaves the prior at 0.56 and the next steps' verifies correct it
(1.13-1.15x at 4 requests over four seeds). What it costs when drafting really does
not pay (p = 0.3): the pool needs a few more failed probes before it switches off,
0.984x plain at one request instead of 0.994x.

Why a window of the last W verify steps (not an EMA): acceptance drifts within a
request (boilerplate, then free text), and a window forgets a phase completely after
W steps. Steps with k = 0 occupy the window too, without evidence: a request the
allocator switched off loses its old evidence after W steps and is priced from the
pooled prior again. In steps where nobody drafts they occupy the pool as well:
were the pool kept for drafting verifies only, an unlucky stretch (say the first
requests' drafts mostly rejected) would switch drafting off for everyone, and with
nobody drafting the pool would never change again. Instead its evidence ages out
after ``pool_size`` steps without drafts (one entry per step, whatever the batch
size), the prior returns to the base rate, and drafting is probed again: a few steps
per ``pool_size`` steps when it really does not pay. A probe costs more than its
drafts: it pays the catch-up backlogs of the requests it drafts for (a lazily
prefilled prompt each), so probes are paced per step, not per request-step; paced
per request-step, 16 requests probed every 32 steps and lost 6% of throughput at
p = 0.3 (simulated on the 13.5B pair's profile), against under 1% now. (While anyone
drafts, the pool keeps drafting verifies only.)

The expected number of accepted drafts of a k-draft chain is
E(k) = sum_{j=1..k} prod_{i<j} alpha_i (draft j counts only if all before it do).

Cost: every update is a few NumPy operations over [batch, positions] arrays; the
state lives in dense arrays indexed by a slot per request (slots are recycled when
a request is forgotten), so neither a step's observe nor its estimate loops over
positions in Python.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class AcceptanceWindows:
    """Sliding-window per-position acceptance of every live request, plus a pooled prior.

    Request ids must be unique within one ``observe`` call (they are: one batch).
    """

    def __init__(
        self,
        window: int,
        positions: int,
        base_rate: float,
        prior_strength: float,
        pool_prior_strength: float,
        pool_size: int = 512,
        initial_capacity: int = 64,
    ) -> None:
        if window < 1 or positions < 1 or pool_size < 1:
            raise ValueError("window, positions and pool_size must be >= 1")
        self.window = window
        self.positions = positions
        self.base_rate = base_rate
        self.prior_strength = prior_strength
        self.pool_prior_strength = pool_prior_strength
        self.pool_size = pool_size  # verifies the pooled prior spans (steps when nobody drafts)
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._used = 0  # slots ever handed out; [0, _used) are live or free
        self._succ = np.zeros((initial_capacity, positions), np.int64)  # [cap, P]
        self._trial = np.zeros((initial_capacity, positions), np.int64)  # [cap, P]
        self._ring = np.zeros((initial_capacity, window, 2), np.int64)  # [cap, W, (k, a)]
        self._head = np.zeros(initial_capacity, np.int64)  # [cap] next ring index
        self._pool_ring = np.zeros((pool_size, 2), np.int64)  # [pool, (k, a)]
        self._pool_head = 0
        self._pool_succ = np.zeros(positions, np.int64)  # [P]
        self._pool_trial = np.zeros(positions, np.int64)  # [P]

    # Updates ---------------------------------------------------------------

    def observe(self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Record one verify step: request rids[i] drafted k_i and got a_i accepted."""
        if not rids:
            return
        k = np.asarray(draft_lens, np.int64)  # [n]
        a = np.asarray(num_accepted, np.int64)  # [n]
        if np.any(a < 0) or np.any(a > k) or np.any(k > self.positions):
            raise ValueError(f"need 0 <= accepted <= draft length <= {self.positions}")
        slots = np.fromiter((self._slot_for(r) for r in rids), np.int64, len(rids))  # [n]
        heads = self._head[slots]
        evicted = self._ring[slots, heads]  # [n, 2]
        new_succ, new_trial = self._evidence(k, a)
        old_succ, old_trial = self._evidence(evicted[:, 0], evicted[:, 1])
        self._succ[slots] += new_succ - old_succ
        self._trial[slots] += new_trial - old_trial
        self._ring[slots, heads, 0] = k
        self._ring[slots, heads, 1] = a
        self._head[slots] = (heads + 1) % self.window
        drafted = k > 0
        if drafted.any():
            self._pool_add(k[drafted], a[drafted])
        else:
            # Nobody drafts: the step enters the pool as one entry without evidence, so
            # the evidence ages out and the prior returns to the base rate (drafting is
            # probed again rather than staying off forever after an unlucky stretch).
            self._pool_add(k[:1], a[:1])

    def forget(self, rid: str) -> None:
        """Drop a finished request's window; its verifies stay in the pooled prior."""
        slot = self._slots.pop(rid, None)
        if slot is None:
            return
        self._succ[slot] = 0
        self._trial[slot] = 0
        self._ring[slot] = 0
        self._head[slot] = 0
        self._free.append(slot)

    # Estimates -------------------------------------------------------------

    def pooled_alphas(self) -> np.ndarray:
        """[P] the prior every request is smoothed toward."""
        m = self.pool_prior_strength
        return (self._pool_succ + m * self.base_rate) / (self._pool_trial + m)

    def alphas(self, rids: Sequence[str], k_max: int) -> np.ndarray:
        """[n, k_max] alpha_j for each request (the pooled prior for unseen requests)."""
        prior = self.pooled_alphas()[:k_max]  # [K]
        idx = np.fromiter((self._slots.get(r, -1) for r in rids), np.int64, len(rids))  # [n]
        known = (idx >= 0)[:, None]  # [n, 1]
        rows = np.maximum(idx, 0)
        succ = np.where(known, self._succ[rows, :k_max], 0)  # [n, K]
        trial = np.where(known, self._trial[rows, :k_max], 0)  # [n, K]
        m = self.prior_strength
        return (succ + m * prior) / (trial + m)

    def gains(self, rids: Sequence[str], k_max: int) -> np.ndarray:
        """[n, k_max] P(drafts 0..j all accepted): the expected tokens draft j adds."""
        return np.cumprod(self.alphas(rids, k_max), axis=1)

    def expected_accepted(self, rid: str, k: int) -> float:
        """E(k) = sum_{j=1..k} prod_{i<j} alpha_i for one request."""
        if k == 0:
            return 0.0
        return float(self.gains([rid], k).sum())

    # Internals -------------------------------------------------------------

    def _evidence(self, k: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, P] successes and trials one (k, a) verify adds per position.

        Positions < a succeeded; position a was tried (and failed) only if a < k.
        """
        cols = np.arange(self.positions)  # [P]
        succ = (cols < a[:, None]).astype(np.int64)
        trial = (cols < np.minimum(a + 1, k)[:, None]).astype(np.int64)
        return succ, trial

    def _pool_add(self, k: np.ndarray, a: np.ndarray) -> None:
        size = len(self._pool_ring)
        k, a = k[-size:], a[-size:]  # more verifies than the pool holds: keep the newest
        if len(k) == 0:
            return
        idx = (self._pool_head + np.arange(len(k))) % size  # [n]
        old = self._pool_ring[idx]
        new_succ, new_trial = self._evidence(k, a)
        old_succ, old_trial = self._evidence(old[:, 0], old[:, 1])
        self._pool_succ += new_succ.sum(axis=0) - old_succ.sum(axis=0)
        self._pool_trial += new_trial.sum(axis=0) - old_trial.sum(axis=0)
        self._pool_ring[idx, 0] = k
        self._pool_ring[idx, 1] = a
        self._pool_head = int((self._pool_head + len(k)) % size)

    def _slot_for(self, rid: str) -> int:
        slot = self._slots.get(rid)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
        else:
            if self._used == len(self._head):
                self._grow()
            slot = self._used
            self._used += 1
        self._slots[rid] = slot
        return slot

    def _grow(self) -> None:
        cap = 2 * len(self._head)
        self._succ = _resized(self._succ, cap)
        self._trial = _resized(self._trial, cap)
        self._ring = _resized(self._ring, cap)
        self._head = _resized(self._head, cap)


def _resized(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *array.shape[1:]), array.dtype)
    out[: len(array)] = array
    return out
