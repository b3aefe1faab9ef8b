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

Cost: the state lives in dense arrays indexed by a slot per request (slots are
recycled when a request is forgotten), updated and read by compiled loops (numba's
``@njit``), so a step's observe and its estimate are one call each, a few microseconds
plus one dictionary lookup per request; as NumPy array operations they took ~40 calls,
0.15-0.4 ms a step on an H200's host.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit


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
        self._pool_head = 0  # next pool ring index
        self._pool_succ = np.zeros(positions, np.int64)  # [P]
        self._pool_trial = np.zeros(positions, np.int64)  # [P]

    # Updates ---------------------------------------------------------------

    def observe(self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Record one verify step: request rids[i] drafted k_i and got a_i accepted."""
        if not rids:
            return
        k = np.asarray(draft_lens, np.int64)  # [n]
        a = np.asarray(num_accepted, np.int64)  # [n]
        slots = np.array([self._slot_for(r) for r in rids], np.int64)  # [n]
        if not _record(self._succ, self._trial, self._ring, self._head, slots, k, a, self.positions):
            raise ValueError(f"need 0 <= accepted <= draft length <= {self.positions}")
        # While anyone drafts, the pool takes the drafting verifies. When nobody drafts,
        # the step enters the pool as one entry without evidence, so the evidence ages
        # out and the prior returns to the base rate (drafting is probed again rather
        # than staying off forever after an unlucky stretch).
        self._pool_head = _pool_record(self._pool_succ, self._pool_trial, self._pool_ring, self._pool_head, k, a)

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
        return self._estimate(rids, k_max, cumulative=False)

    def gains(self, rids: Sequence[str], k_max: int) -> np.ndarray:
        """[n, k_max] P(drafts 0..j all accepted): the expected tokens draft j adds."""
        return self._estimate(rids, k_max, cumulative=True)

    def _estimate(self, rids: Sequence[str], k_max: int, cumulative: bool) -> np.ndarray:
        idx = np.array([self._slots.get(r, -1) for r in rids], np.int64)  # [n], -1: unseen
        return _estimate(
            self._succ, self._trial, idx, self.pooled_alphas(), self.prior_strength, k_max, cumulative
        )

    def expected_accepted(self, rid: str, k: int) -> float:
        """E(k) = sum_{j=1..k} prod_{i<j} alpha_i for one request."""
        if k == 0:
            return 0.0
        return float(self.gains([rid], k).sum())

    # Internals -------------------------------------------------------------

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


@njit(cache=True)
def _add_evidence(succ: np.ndarray, trial: np.ndarray, k: int, a: int, sign: int) -> None:
    """Add (sign 1) or remove (-1) one (k, a) verify's evidence from [P] counts:
    positions < a succeeded; position a was tried (and failed) only if a < k."""
    for p in range(a):
        succ[p] += sign
    for p in range(min(a + 1, k)):
        trial[p] += sign


@njit(cache=True)
def _record(
    succ: np.ndarray,  # [cap, P]
    trial: np.ndarray,  # [cap, P]
    ring: np.ndarray,  # [cap, W, (k, a)]
    head: np.ndarray,  # [cap]
    slots: np.ndarray,  # [n] distinct
    k: np.ndarray,  # [n]
    a: np.ndarray,  # [n]
    positions: int,
) -> bool:
    """One verify step into each request's window (its oldest step ages out). False,
    and nothing recorded, when some 0 <= a <= k <= positions does not hold."""
    for n in range(len(slots)):
        if a[n] < 0 or a[n] > k[n] or k[n] > positions:
            return False
    window = ring.shape[1]
    for n in range(len(slots)):
        s, h = slots[n], head[slots[n]]
        _add_evidence(succ[s], trial[s], ring[s, h, 0], ring[s, h, 1], -1)
        _add_evidence(succ[s], trial[s], k[n], a[n], 1)
        ring[s, h, 0], ring[s, h, 1] = k[n], a[n]
        head[s] = (h + 1) % window
    return True


@njit(cache=True)
def _pool_record(
    succ: np.ndarray,  # [P]
    trial: np.ndarray,  # [P]
    ring: np.ndarray,  # [pool, (k, a)]
    head: int,
    k: np.ndarray,  # [n] one step's verifies
    a: np.ndarray,  # [n]
) -> int:
    """The step's drafting verifies into the pool (more than it holds: the newest),
    or one entry without evidence when nobody drafted; returns the new head."""
    drafted = 0
    for n in range(len(k)):
        if k[n] > 0:
            drafted += 1
    skip = max(drafted - len(ring), 0)
    for n in range(len(k)):
        if drafted and k[n] == 0:
            continue
        if skip:
            skip -= 1
            continue
        _add_evidence(succ, trial, ring[head, 0], ring[head, 1], -1)
        _add_evidence(succ, trial, k[n], a[n], 1)
        ring[head, 0], ring[head, 1] = k[n], a[n]
        head = (head + 1) % len(ring)
        if not drafted:
            break
    return head


@njit(cache=True)
def _estimate(
    succ: np.ndarray,  # [cap, P]
    trial: np.ndarray,  # [cap, P]
    idx: np.ndarray,  # [n] slots, -1: unseen
    prior: np.ndarray,  # [P]
    m: float,
    k_max: int,
    cumulative: bool,
) -> np.ndarray:
    """[n, k_max] alpha_j = (succ_j + m prior_j) / (trial_j + m), or with ``cumulative``
    their running products (the gains)."""
    out = np.empty((len(idx), k_max))
    for n in range(len(idx)):
        running = 1.0
        for j in range(k_max):
            if idx[n] >= 0:
                alpha = (succ[idx[n], j] + m * prior[j]) / (trial[idx[n], j] + m)
            else:
                alpha = (m * prior[j]) / m
            running = running * alpha if cumulative else alpha
            out[n, j] = running
    return out
