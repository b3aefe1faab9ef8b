"""Choose every request's draft length for one step: the most tokens per second.

Objective. With g[i, j] = P(request i's drafts 0..j are all accepted) (the expected
tokens its (j+1)-th draft adds; non-increasing in j) and T(k) the cost model's step
time, the step emits sum_i (1 + E_i(k_i)) tokens in expectation, E_i(k) =
sum_{j<k} g[i, j], so the allocator maximises the batch's throughput

    R(k) = sum_i (1 + E_i(k_i)) / T(k),      0 <= k_i <= K_max.

k_i = 0 is allowed: a request whose drafts do not pay decodes normally. At high
load, when a verify token costs a compute-bound GEMM row, that is most requests.
A step in which nobody drafts is a plain decode, priced by the cost model's plain
term where the profile has one (cheaper than a verify: the first draft of a step
pays for the switch to the verify path, which the exact evaluation below includes).

Algorithm (greedy marginal gain). Draft positions are *items*: item (i, j) takes
request i from k_i = j to j + 1, gains g[i, j] tokens and costs
- its own draft work c[i, j]: the charged catch-up tokens for j = 0 (a backlog is
  spread over several steps: drafter.charged_catchup), a DECODE row for
  j > 0, plus reading the request's context in that forward;
- one more verify token, whose price v_n (the n-th extra token) depends only on
  how many items were taken, since every item adds exactly one verify token;
- a whole draft forward when it is the first item at its depth j + 1, and more
  catch-up forwards as the catch-up tokens of the requests drafting so far grow (a
  catch-up longer than the CUDA graphs hold runs in several decode-row forwards:
  ``CatchupPieces``).
When the step's draft forwards run as one chain (``chained``: every drafting request
runs to the deepest draft, ``cost_model``), an item at j > 0 has no draft cost of its
own; instead every drafting request pays a DECODE row per step of the chain, so the
step's draft rows cost (deepest - 1) times the row prices of the requests drafting so
far, which the exact evaluation adds (and which, like the forwards, never falls when
an item is added). A chain of two or more steps runs one step more once a request
whose draft KV lags its committed length drafts (cost_model.chain_lags): one more
decode forward and one more row per drafting request, charged in the share the
largest ``lag_weights`` of the drafting requests says (all of it by default; the
drafter charges a backlog's over its horizon), also never falling.
Adding an item with gain g and cost c raises R = S / T iff g / c > R, so items are
offered best first by marginal efficiency g / (c + v_1): the order in which
single-position greedy would add them. Within a request the order is kept a prefix
(efficiency is made non-increasing along j; the first item, which carries the
catch-up cost, is ranked by the best efficiency of the bundles it opens, so a long
catch-up does not hide a good request). Walking that order, R is evaluated exactly
after every item (cumulative gains, cumulative own costs, verify price from the
item count, forward cost from the deepest item so far and the catch-up tokens so
far), and the best point is kept instead of stopping at the first item that does
not pay: a new draft forward is shared by every request that uses it, and only the
group pays for it. The walk is repeated for each depth cap 1..K_max (items deeper
than the cap left out), so deep items of one excellent request cannot force a
forward the others do not need. A cap on the total drafts (the verify tokens the CUDA
graphs hold) ends every walk early. When catch-ups run in several forwards the walks
are repeated once more with a piece-aware ranking (``allocate``). An item whose gain
over its least marginal cost (own cost and one verify token; for a request's first
item, over its best bundle) is at most the best rate found so far would lower the
rate of any point it joined, so the walks leave such items out (the premises are at
``_walk_kernel``): at high load most.
All of it is a sort of the offered items (at most bs * K_max) and at most K_max passes
over them, compiled with numba (``@njit``; as NumPy array operations the same passes
cost ~180 NumPy calls a step, 0.2-0.5 ms at 1-64 requests on an H200 machine's host
against 0.05-0.11 ms compiled: results/gpu/2026-12-04-policy-kernels.md). Before any of
it, a bound returns the plain decode when no draft can pay, which at high load is most
steps: for every depth c and every n, the n largest gains
among positions < c at the price of the fastest step with n drafts at most c deep (a
verify of bs + n tokens, c draft forwards, and the least catch-ups of the fewest
requests those drafts can come from, with the forwards they fill when catch-ups run in
pieces), and, checked first, each request's drafts priced with its own costs: the
profit of any n drafts at rate R (their gains less R times their costs) under the
requests' concave envelopes (``_profit_kernel``).

Worked example, two requests, K_max = 2, costs in ms: verify 10 + 2 per token
beyond 2 tokens (compute-bound past bs), one draft forward 1, no per-row draft
cost; request A with alpha = 0.9 (g = [0.9, 0.81]), B with alpha = 0.3
(g = [0.3, 0.09]).
    k = (0, 0): 2 tokens / 10 ms                          = 200 tokens/s
    order by g / (c + v_1) = g / 2: A0 (0.45), A1 (0.41), B0 (0.15), B1 (0.05)
    cap 2:  + A0: 2.9 / (10 + 2 + 1)        = 223 tokens/s
            + A1: 3.71 / (13 + 2 + 1)       = 232 tokens/s   <- best
            + B0: 4.01 / (16 + 2)           = 223 tokens/s
            + B1: 4.10 / (18 + 2)           = 205 tokens/s
    cap 1:  + A0 = 223, + B0: 3.2 / 15      = 213 tokens/s
    -> k = (2, 0): A drafts two tokens, B does not draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from numba import njit

from faser_sglang.spec_worker.adaptive.cost_model import CostModel, lagging
from faser_sglang.spec_worker.policy import MAX_CATCHUP_PIECES, STEADY_CATCHUP

MIN_ITEM_SECONDS = 1e-12
NO_CAP = -1  # max_drafts as the kernels take it: no cap on the total drafts


@dataclass(frozen=True)
class CatchupPieces:
    """Catch-up forwards a step is charged. A catch-up of c tokens is priced as F(c) =
    ceil(c / piece_tokens) forwards, at most MAX_CATCHUP_PIECES (policy.catchup_forwards).
    The forwards of the requests' usual catch-ups (``steady``: up to STEADY_CATCHUP
    tokens each) are the step's own; those the backlogs add are paid once and charged
    1/h of, h the shortest horizon among the requests that bring a backlog
    (drafter.charged_catchup charges request i's backlog tokens over its h_i):
    F(steady) + (F(total) - F(steady)) / h. Never less when a request is added (F is
    non-decreasing, F(total) >= F(steady), and h can only shrink), which the walks'
    pruning relies on."""

    total: np.ndarray  # [bs] each request's catch-up tokens
    piece_tokens: int
    horizon: np.ndarray  # [bs] steps over which each request's backlog is charged, >= 1

    @property
    def steady(self) -> np.ndarray:
        """[bs] each request's usual catch-up tokens."""
        return np.minimum(self.total, STEADY_CATCHUP)

    @property
    def backlog_rate(self) -> np.ndarray:
        """[bs] 1 / h_i for a request with a backlog, 0 without one."""
        return np.where(self.total > self.steady, 1.0 / self.horizon, 0.0)


@dataclass(frozen=True)
class Allocation:
    draft_lens: tuple[int, ...]  # [bs] chosen k_i
    expected_tokens: float  # sum_i (1 + E_i(k_i)): tokens the step emits in expectation
    step_seconds: float  # T(k), the cost model's prediction

    @property
    def tokens_per_second(self) -> float:
        return self.expected_tokens / self.step_seconds


def allocate(
    gains: np.ndarray,  # [bs, K_max] g[i, j], non-increasing along j
    seq_lens: np.ndarray,  # [bs] committed tokens per request
    catchup: np.ndarray,  # [bs] catch-up tokens charged to the step if a request drafts
    cost: CostModel,
    max_drafts: Optional[int] = None,  # at most this many drafts in all (None: no cap)
    pieces: Optional[CatchupPieces] = None,  # None: a catch-up is one forward
    drafting_overhead: float = 0.0,  # seconds any drafting step adds beyond ``cost`` (calibration.py)
    chained: bool = False,  # the draft forwards run as one chain: every drafting row runs to the deepest
    lag_weights: Optional[np.ndarray] = None,  # [bs] share of a lagging request's chain step charged (drafter.lag_weights)
) -> Allocation:
    """Draft lengths maximising expected tokens per second (see the module docstring).

    ``max_drafts`` caps sum_i k_i (the verify tokens CUDA graphs hold, minus one per
    request): each walk stops after that many items, so the best capped point is found
    the same way as the best uncapped one."""
    gains = np.ascontiguousarray(gains, np.float64)
    bs, k_max = gains.shape
    seq_lens = np.asarray(seq_lens, np.float64)
    d = cost.draft
    no_draft = Allocation((0,) * bs, float(bs), cost.no_draft_time(seq_lens))
    if bs == 0 or k_max == 0 or (max_drafts is not None and max_drafts <= 0):
        return no_draft
    context = float(seq_lens.sum())
    verify = cost.verify.time(bs, bs + np.arange(bs * k_max + 1), context)  # [M+1]
    # [K+1] seconds of draft forwards (and the drafting step's overhead) when the deepest draft is 0..K.
    forward = np.concatenate(([0.0], drafting_overhead + d.extend_forward + d.decode_forward * np.arange(k_max)))
    row = d.row_step + d.context_row_step * seq_lens  # [bs] a request's DECODE row in one draft forward
    own = np.empty((bs, k_max))  # [bs, K] item's own draft cost c[i, j]
    own[:] = 0.0 if chained else row[:, None]
    own[:, 0] = d.catchup_token * np.asarray(catchup, np.float64) + d.context_row_step * seq_lens
    chain_rows = row if chained else np.zeros(bs)  # [bs] per chain step, once the request drafts
    # [bs] share of the chain step a request whose draft KV lags its committed length
    # adds (cost_model.chain_lags) that the step is charged; all of it by default.
    lags = np.ascontiguousarray(lagging(catchup) if lag_weights is None else lag_weights, np.float64)
    lag_forward = d.decode_forward if chained else 0.0
    if not _any_draft_can_pay(
        gains, own, chain_rows, verify, forward, max_drafts, pieces, d.extend_forward, no_draft.tokens_per_second
    ):  # fmt: skip
        return no_draft
    # [bs, K] with the first verify token's price; floored so a free item ranks first
    # instead of dividing by zero (a fit may price some features at exactly 0).
    priced = np.maximum(own + (verify[1] - verify[0]), MIN_ITEM_SECONDS)
    walk = _Walk(
        gains, own, chain_rows, lags, lag_forward, verify, forward, d.extend_forward,
        _kernel_pieces(pieces, bs), max_drafts, _ceilings(gains, priced),
    )  # fmt: skip
    best = walk.best(priced, no_draft)
    if pieces is not None:
        # Catch-up forwards are a step function of the drafting requests' tokens, which
        # no item order prices exactly: walk again with each catch-up ranked with its
        # share of the piece forwards it fills (its charged tokens over a piece's; a ranking
        # weight, not a price), and keep the better point.
        with_pieces = priced.copy()
        with_pieces[:, 0] += d.extend_forward * np.asarray(catchup, np.float64) / pieces.piece_tokens
        best = walk.best(with_pieces, best)
    return best


@dataclass(frozen=True)
class _Walk:
    """The best-first walks over draft positions for one step (see the module docstring)."""

    gains: np.ndarray  # [bs, K]
    own: np.ndarray  # [bs, K] item's own draft cost
    chain_rows: np.ndarray  # [bs] a drafting request's row per chain step (zeros without a chain)
    lags: np.ndarray  # [bs] share of a chain step charged when the request drafts (0: none)
    lag_forward: float  # seconds of that step's forward (0 without a chain)
    verify: np.ndarray  # [M+1] verify seconds with 0..M extra tokens
    forward: np.ndarray  # [K+1] draft forwards' seconds when the deepest draft is 0..K
    catchup_forward: float  # seconds per catch-up forward
    # [bs] steady, total and backlog_rate of the step's CatchupPieces, and piece_tokens
    # (0 without pieces, when the arrays go unread)
    pieces: tuple[np.ndarray, np.ndarray, np.ndarray, int]
    max_drafts: Optional[int]
    # [bs, K] each item's gain over its least marginal cost (own + one verify token), the
    # first item's over its request's best bundle, non-increasing along j.
    ceiling: np.ndarray

    def best(self, priced: np.ndarray, best: Allocation) -> Allocation:
        """The best of ``best`` and every walk's points, items ranked by ``priced`` ([bs, K])."""
        steady, total, backlog_rate, piece_tokens = self.pieces
        lens = np.zeros(len(self.gains), np.int64)
        found, tokens, seconds = _walk_kernel(
            self.gains, self.own, self.chain_rows, self.lags, self.lag_forward, self.verify, self.forward,
            _ranking_key(self.gains, priced),
            np.ascontiguousarray(self.ceiling, np.float64), NO_CAP if self.max_drafts is None else self.max_drafts,
            steady, total, backlog_rate, piece_tokens, self.catchup_forward, best.tokens_per_second, lens,
        )  # fmt: skip
        if not found:
            return best
        return Allocation(tuple(lens.tolist()), tokens, seconds)


def _kernel_pieces(pieces: Optional[CatchupPieces], bs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """_Walk.pieces: the walk kernel's view of a step's catch-up pieces."""
    if pieces is None:
        unused = np.zeros(bs)
        return unused, unused, unused, 0
    steady, total, rate = (np.asarray(a, np.float64) for a in (pieces.steady, pieces.total, pieces.backlog_rate))
    return steady, total, rate, pieces.piece_tokens


@njit(cache=True)
def _walk_kernel(
    gains: np.ndarray,  # [bs, K]
    own: np.ndarray,  # [bs, K]
    chain_rows: np.ndarray,  # [bs]
    lags: np.ndarray,  # [bs]
    lag_forward: float,
    verify: np.ndarray,  # [M+1]
    forward: np.ndarray,  # [K+1]
    key: np.ndarray,  # [bs, K] ranking key (_ranking_key)
    ceiling: np.ndarray,  # [bs, K]
    max_drafts: int,  # NO_CAP: none
    steady: np.ndarray,  # [bs] pieces only (piece_tokens > 0)
    total: np.ndarray,  # [bs]
    backlog_rate: np.ndarray,  # [bs]
    piece_tokens: int,  # 0: a catch-up is one forward
    catchup_forward: float,
    best_rate: float,
    lens: np.ndarray,  # [bs] out: the best point's k_i
) -> tuple[bool, float, float]:
    """Walk c - 1 (c = 1..K) takes the offered items of depth <= c in ranking order and
    evaluates R after each; the first point of the highest rate (shallowest walk, then
    fewest items) wins if it beats ``best_rate``. Returns (found, tokens, seconds)."""
    bs, k_max = gains.shape
    # An item that gains nothing (a draft the worker cuts near max_new_tokens, or an
    # acceptance of 0) never raises a rate; left in, it could be chosen where the
    # profile prices a drafting step below the plain decode, and then cut.
    # An item (with the rest of its request's drafts) whose ceiling is at most the best
    # rate so far lowers the rate of every point it joins: its marginal cost is at least
    # own + one verify token, since verify prices are convex and forwards and charged
    # catch-up forwards never fall when an item is added. Taking such items out of a
    # point down to none ends at a verify of bs tokens alone, so the argument needs that
    # to be no faster than the best rate; it is whenever the plain decode is cheaper
    # than that verify (cost files fitted with the tied plain term). At high load most
    # items go. Ceilings are non-increasing along j: requests keep prefixes. Chain rows
    # and a lagging request's chain step only add to an item's marginal cost.
    prune = bs / verify[0] <= best_rate
    # The offered items in level-major order (id = j * bs + i), so the stable sort below
    # breaks ties toward shallower items, which share forwards already paid for. Only
    # they are sorted: at high load most items are left out.
    offered = np.empty(bs * k_max, np.int64)
    neg_key = np.empty(bs * k_max)
    n, depths = 0, 0  # offered items; the deepest one's depth + 1
    for j in range(k_max):
        for i in range(bs):
            if gains[i, j] > 0 and (not prune or ceiling[i, j] > best_rate):
                offered[n], neg_key[n] = j * bs + i, -key[i, j]
                n += 1
                depths = j + 1
    ranked = offered[np.argsort(neg_key[:n], kind="mergesort")]
    # [n] the offered items' requests and depths in ranking order (held apart: the walks
    # read them K times)
    item_req, item_depth = ranked % bs, ranked // bs
    top_rate, top_cap, top_last, top_tokens, top_seconds = -np.inf, 0, 0, 0.0, 0.0
    # A walk capped deeper than every offered item repeats the walk capped at its depth,
    # whose points win ties (shallowest walk first).
    for cap in range(1, depths + 1):
        tokens, own_sum, count, deepest, rows_sum, lag = float(bs), 0.0, 0, 0, 0.0, 0.0
        steady_sum, total_sum, rate_max, charged = 0.0, 0.0, 0.0, 1.0
        for m in range(n):
            i, j = item_req[m], item_depth[m]
            if j >= cap:
                continue
            count += 1
            if max_drafts != NO_CAP and count > max_drafts:
                break
            tokens += gains[i, j]
            own_sum += own[i, j]
            if j == 0:
                rows_sum += chain_rows[i]
                lag = max(lag, lags[i])
            deepest = max(deepest, j + 1)
            seconds = own_sum + verify[count] + forward[deepest] + rows_sum * (deepest - 1)
            if deepest > 1:  # the chain's step for a lagging request, every drafting row in it
                seconds += lag * (lag_forward + rows_sum)
            if piece_tokens > 0:  # catch-up forwards beyond the first
                if j == 0:  # the request's first item brings its catch-up tokens
                    steady_sum += steady[i]
                    total_sum += total[i]
                    rate_max = max(rate_max, backlog_rate[i])  # the shortest horizon so far
                    charged = _charged_forwards(steady_sum, total_sum, rate_max, piece_tokens)
                seconds = seconds + catchup_forward * (charged - 1)
            rate = tokens / seconds
            if rate > top_rate:
                top_rate, top_cap, top_last, top_tokens, top_seconds = rate, cap, m, tokens, seconds
    if top_rate <= best_rate:
        return False, 0.0, 0.0
    for m in range(top_last + 1):
        if item_depth[m] < top_cap:
            lens[item_req[m]] += 1
    return True, top_tokens, top_seconds


@njit(cache=True)
def _charged_forwards(steady: float, total: float, rate: float, piece_tokens: int) -> float:
    """Forwards CatchupPieces charges for catch-ups of ``steady`` / ``total`` tokens whose
    backlogs' largest backlog_rate is ``rate``: F(steady) + (F(total) - F(steady)) * rate,
    F the forwards of policy.catchup_forwards."""
    usual = _catchup_forwards(steady, piece_tokens)
    return usual + (_catchup_forwards(total, piece_tokens) - usual) * rate


@njit(cache=True)
def _catchup_forwards(tokens: float, piece_tokens: int) -> float:
    """policy.catchup_forwards for one catch-up of ``tokens`` > 0 tokens."""
    return min(max(np.ceil(tokens / piece_tokens), 1.0), float(MAX_CATCHUP_PIECES))


def _any_draft_can_pay(
    gains: np.ndarray,  # [bs, K]
    own: np.ndarray,  # [bs, K] item's own draft cost (a request's catch-up on its first)
    chain_rows: np.ndarray,  # [bs] a drafting request's row per chain step (zeros without a chain)
    verify: np.ndarray,  # [M+1] verify seconds with 0..M drafts
    forward: np.ndarray,  # [K+1] draft forwards' seconds when the deepest draft is 0..K
    max_drafts: Optional[int],
    pieces: Optional[CatchupPieces],  # None: a catch-up is one forward
    catchup_forward: float,  # seconds per catch-up forward
    plain_rate: float,
) -> bool:
    """False when no allocation can beat the plain decode's ``plain_rate``. A step with n
    drafts, the deepest at depth c, emits at most bs + the n largest gains among
    positions < c, and draws them from at least r = ceil(n / c) requests. It takes at
    least the verify of bs + n tokens, c draft forwards and the drafts' own costs: each
    at least the least own cost lo, the r cheapest first drafts (which carry their
    requests' catch-ups) what they cost beyond lo, in a chain c - 1 rows of each of r
    requests at the least chain row, and with catch-ups in pieces the forwards of the
    r least usual catch-ups (CatchupPieces charges at least those of the drafting
    requests' usual catch-ups, and they are at least these). Checked for every c and n
    (costs are non-negative: CostModel.from_dict refuses others). This is the regime of
    high load (a verify token dearer than its gain is worth, catch-ups grown over plain
    steps), where it saves the walks; bounding each depth apart keeps the deep drafts of
    a few well-accepted requests from passing it at the price of one forward and one
    catch-up.

    Taking gains and costs apart is loose where costs differ between requests: with
    catch-ups in pieces, the n largest gains come from many more than r requests, whose
    catch-ups fill more forwards. A second bound, checked first (``_profit_kernel``),
    prices each request's drafts together with its own costs."""
    steady = np.zeros(len(gains)) if pieces is None else np.asarray(pieces.steady, np.float64)
    args = (
        gains, own, chain_rows, verify, forward, NO_CAP if max_drafts is None else max_drafts,
        steady, 0 if pieces is None else pieces.piece_tokens, catchup_forward, plain_rate,
    )  # fmt: skip
    return _profit_kernel(*args) and _bound_kernel(*args)


@njit(cache=True)
def _bound_kernel(
    gains: np.ndarray,  # [bs, K]
    own: np.ndarray,  # [bs, K]
    chain_rows: np.ndarray,  # [bs]
    verify: np.ndarray,  # [M+1]
    forward: np.ndarray,  # [K+1]
    max_drafts: int,  # NO_CAP: none
    steady: np.ndarray,  # [bs] each request's usual catch-up tokens (pieces only)
    piece_tokens: int,  # 0: a catch-up is one forward
    catchup_forward: float,
    plain_rate: float,
) -> bool:
    bs, k_max = gains.shape
    lo = own.min()
    chain_lo = chain_rows.min()
    # [bs+1] over the r cheapest first items, what they cost beyond lo, and over the r
    # least usual catch-ups, their tokens; each summed
    first = np.zeros(bs + 1)
    first[1:] = np.cumsum(np.sort(own[:, 0]) - lo)
    least_steady = np.zeros(bs + 1)
    least_steady[1:] = np.cumsum(np.sort(steady))
    flat = np.empty(bs * k_max)  # level-major: item j * bs + i
    for j in range(k_max):
        for i in range(bs):
            flat[j * bs + i] = gains[i, j]
    order = np.argsort(-flat)  # largest gain first
    for cap in range(1, k_max + 1):
        count, top = 0, 0.0  # n, the n largest gains at positions < cap
        for item in order:
            if item // bs >= cap:
                continue
            count += 1
            if max_drafts != NO_CAP and count > max_drafts:
                break
            top += flat[item]
            requests = (count + cap - 1) // cap  # at least, drafting up to cap deep
            seconds = verify[count] + forward[cap] + lo * count + first[requests] + chain_lo * (cap - 1) * requests
            if piece_tokens > 0:
                seconds += catchup_forward * (_catchup_forwards(least_steady[requests], piece_tokens) - 1.0)
            if (bs + top) / seconds > plain_rate:
                return True
    return False


# Relative slack by which _profit_kernel lets a point pass: its sums and the walks' run
# in different orders, so a point the walks price a hair above the plain rate must not
# be ruled out by rounding.
PROFIT_SLACK = 1e-9
# Most verify token prices _profit_kernel bounds against (a fit has a few pieces).
MAX_LAMBDAS = 8


@njit(cache=True)
def _profit_kernel(
    gains: np.ndarray,  # [bs, K]
    own: np.ndarray,  # [bs, K]
    chain_rows: np.ndarray,  # [bs]
    verify: np.ndarray,  # [M+1]
    forward: np.ndarray,  # [K+1]
    max_drafts: int,  # NO_CAP: none
    steady: np.ndarray,  # [bs] each request's usual catch-up tokens (pieces only)
    piece_tokens: int,  # 0: a catch-up is one forward
    catchup_forward: float,
    plain_rate: float,
) -> bool:
    """False when no allocation can beat ``plain_rate`` (R), each request's drafts priced
    with its own costs. A point of n drafts, the deepest at depth c, from the requests D,
    beats R only if its profit, sum over its drafts of (g - R own) less R e_i for each i
    in D, exceeds R (V(n) + F(c) + const) - bs, since the walks' step time is at least
    V(n) (verify) + F(c) (forwards) + the drafts' own costs + e_i per drafting request
    + const: e_i = (c - 1) chain_rows[i] (its rows of the chain); a lagging request's
    chain step only adds. With catch-ups in pieces, CatchupPieces charges at least
    F(s) >= min(s / piece_tokens, MAX_CATCHUP_PIECES) forwards for the drafting requests'
    usual catch-up tokens s, so the piece forwards beyond the first cost at least the
    smaller of (a) sum over D of catchup_forward * s_i / piece_tokens, less one forward
    (const = -catchup_forward), and (b) MAX_CATCHUP_PIECES - 1 forwards (const; e_i
    without the catch-up share); (b) is checked only where all requests' usual
    catch-ups together could pass MAX_CATCHUP_PIECES pieces.
    A request's profit over its first k drafts, P_i(k), lies under its upper concave
    envelope, whose unit slopes, taken largest first across requests, bound the profit of
    any n drafts, prefixes or not: S(n). For any lambda, S(n) <= H(lambda) + lambda n
    with H(lambda) the sum of (slope - lambda) over slopes above it, so a point beats R
    only if H(lambda) + max over n' <= n of (lambda n' - R V(n')) > R (F(c) + const) - bs.
    lambda runs over R times the verify's token prices (one per piece of the piecewise
    linear fit, at most MAX_LAMBDAS: for a linear verify the bound is then exact for the
    envelopes; any lambdas give a bound), which needs no sort. Checked for every depth
    c: K_max envelopes of up to K_max + 1 points a request, each a monotone stack."""
    bs, k_max = gains.shape
    most = bs * k_max if max_drafts == NO_CAP else min(bs * k_max, max_drafts)
    # The verify's distinct token prices, times R: the lambdas.
    lambdas = np.empty(MAX_LAMBDAS)
    count = 0
    for n in range(1, most + 1):
        value = (verify[n] - verify[n - 1]) * plain_rate
        if count == 0 or abs(value - lambdas[count - 1]) > 1e-9 * max(abs(value), abs(lambdas[count - 1])):
            if count == MAX_LAMBDAS:
                break
            lambdas[count] = value
            count += 1
    # [q, most+1] max over 1 <= n' <= n of lambda n' - R V(n')
    reach = np.full((count, most + 1), -np.inf)
    for q in range(count):
        for n in range(1, most + 1):
            reach[q, n] = max(reach[q, n - 1], lambdas[q] * n - plain_rate * verify[n])
    cases = 1
    if piece_tokens > 0 and steady.sum() > MAX_CATCHUP_PIECES * piece_tokens:
        cases = 2
    profit = np.empty(k_max + 1)  # [k+1] P_i(k)
    hull = np.empty(k_max + 1, np.int64)  # the envelope's points, a stack
    above = np.empty(count)  # [q] H(lambda_q)
    for cap in range(1, k_max + 1):
        n_cap = min(bs * cap, most)
        for case in range(cases):
            const = 0.0
            if piece_tokens > 0:
                const = -catchup_forward if case == 0 else catchup_forward * (MAX_CATCHUP_PIECES - 1)
            above[:] = 0.0
            for i in range(bs):
                extra = (cap - 1) * chain_rows[i]
                if piece_tokens > 0 and case == 0:
                    extra += catchup_forward * steady[i] / piece_tokens
                profit[0] = 0.0
                for j in range(cap):
                    profit[j + 1] = profit[j] + gains[i, j] - plain_rate * own[i, j]
                for j in range(1, cap + 1):
                    profit[j] -= plain_rate * extra
                top = 0
                for t in range(cap + 1):
                    while top >= 2:  # drop the last point unless it lies above the chord to t
                        a, b = hull[top - 2], hull[top - 1]
                        if (profit[b] - profit[a]) * (t - a) > (profit[t] - profit[a]) * (b - a):
                            break
                        top -= 1
                    hull[top] = t
                    top += 1
                for e in range(top - 1):
                    k0, k1 = hull[e], hull[e + 1]
                    slope = (profit[k1] - profit[k0]) / (k1 - k0)
                    for q in range(count):
                        if slope > lambdas[q]:
                            above[q] += (slope - lambdas[q]) * (k1 - k0)
            bound = np.inf
            for q in range(count):
                bound = min(bound, above[q] + reach[q, n_cap])
            need = plain_rate * (forward[cap] + const) - bs
            if bound > need - PROFIT_SLACK * (abs(need) + bs):
                return True
    return False


@njit(cache=True)
def _ranking_key(gains: np.ndarray, priced: np.ndarray) -> np.ndarray:
    """[bs, K] marginal efficiency g / priced, the first item's the best of the bundles it
    opens, made non-increasing along j (so a request's items are taken as a prefix)."""
    bs, k_max = gains.shape
    key = np.empty((bs, k_max))
    for i in range(bs):
        gain_sum, price_sum, bundle = 0.0, 0.0, -np.inf
        for j in range(k_max):
            gain_sum += gains[i, j]
            price_sum += priced[i, j]
            bundle = max(bundle, gain_sum / price_sum)
        key[i, 0] = bundle
        for j in range(1, k_max):
            key[i, j] = min(key[i, j - 1], gains[i, j] / priced[i, j])
    return key


def _ceilings(gains: np.ndarray, priced: np.ndarray) -> np.ndarray:
    """[bs, K] _Walk.ceiling: the ranking key of the walk that prices each item at its
    own cost and one verify token (``priced``), the least it can add to a step."""
    return _ranking_key(gains, priced)
