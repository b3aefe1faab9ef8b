"""Length policies: choose each request's draft length k_i every step.

A policy sees the requests of the running batch by id, returns one k_i in
[0, K_max] per request, and is told afterwards how many drafts each request got
accepted. k_i = 0 means the request decodes normally this step (one verify token,
no draft work). Policies that price their choices (the adaptive drafter) also read
a ``StepContext`` describing the batch; the others ignore it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

import numpy as np

from faser_sglang.config import FaserConfig

if TYPE_CHECKING:
    from faser_sglang.spec_worker.adaptive import Deployment


@dataclass(frozen=True)
class StepContext:
    """The batch a step's lengths are chosen for, in the order of ``rids``.

    Worked example, committed lengths [10, 7], draft KV fill [9, 7]: request 0's
    catch-up forward feeds positions 9..10 (one committed token the draft has not
    seen, then the bonus token), request 1's feeds position 7 (the bonus token):
    catchup_tokens() == (2, 1).
    """

    seq_lens: tuple[int, ...]  # [bs] committed tokens per request (KV the verify reads)
    draft_kv_lens: tuple[int, ...]  # [bs] tokens already in the draft model's KV
    # Verify tokens (sum of k_i + 1) the step's CUDA graphs hold; None: no such cap.
    max_verify_tokens: Optional[int] = None
    # Catch-up tokens one draft forward feeds (a catch-up of c tokens runs ceil(c / this)
    # forwards, at most MAX_CATCHUP_PIECES); None: one forward whatever c.
    catchup_piece_tokens: Optional[int] = None
    # [bs] tokens each request may still emit (max_new_tokens less those emitted; None:
    # no limit); None: unknown for every request.
    remaining_tokens: Optional[tuple[Optional[int], ...]] = None
    # Whether the step's draft forwards after the catch-up run as one chain, in which
    # every drafting request runs to the longest draft (spec_worker/draft_chain.py).
    chained: bool = False

    def __post_init__(self) -> None:
        if len(self.seq_lens) != len(self.draft_kv_lens):
            raise ValueError(
                f"StepContext: {len(self.seq_lens)} seq_lens but {len(self.draft_kv_lens)} draft_kv_lens"
            )
        if self.remaining_tokens is not None and len(self.remaining_tokens) != len(self.seq_lens):
            raise ValueError(
                f"StepContext: {len(self.seq_lens)} seq_lens but {len(self.remaining_tokens)} remaining_tokens"
            )

    def max_drafts(self) -> Optional[int]:
        """Drafts (sum of k_i) that keep the verify within ``max_verify_tokens``."""
        return draft_room(len(self.seq_lens), self.max_verify_tokens)

    def catchup_tokens(self) -> tuple[int, ...]:
        """[bs] tokens the draft's catch-up forward feeds a request if it drafts."""
        return tuple(n - d + 1 for n, d in zip(self.seq_lens, self.draft_kv_lens))


# Most catch-up tokens a request that drafted last step needs: the bonus token, after
# its last draft when every draft was accepted (the draft fed all but that one), else
# the bonus alone (StepContext.catchup_tokens). Tokens beyond it are a backlog.
STEADY_CATCHUP = 2

# Most decode-row forwards a draft catch-up runs as (chunk_forward.pieces) before it
# takes one EXTEND forward: on an H200 eight graph replays of the 0.42B draft (~2.5 ms
# each) still beat its eager EXTEND (20-45 ms whatever the length, profiled 2026-12-01),
# so pricing a longer catch-up as this many forwards is about right too.
MAX_CATCHUP_PIECES = 8


def catchup_forwards(tokens: Any, piece_tokens: Optional[int]) -> np.ndarray:
    """Draft forwards a catch-up of ``tokens`` (> 0; a scalar or an array) is priced as:
    pieces of ``piece_tokens``, at most MAX_CATCHUP_PIECES (beyond that one EXTEND of
    about that cost); one whatever its length without a piece size."""
    tokens = np.asarray(tokens, np.float64)
    if piece_tokens is None:
        return np.ones_like(tokens)
    return np.clip(np.ceil(tokens / piece_tokens), 1, MAX_CATCHUP_PIECES)


def draft_caps(remaining: Sequence[Optional[int]], k_max: int) -> list[int]:
    """[bs] most drafts each request may take this step: ``k_max``, or fewer near its
    max_new_tokens (``remaining``: tokens it may still emit besides its bonus token,
    None: no limit). A step emits at most k + 1 tokens, so with k <= remaining - 2 the
    request reaches its limit only in a one-token step (worker.cap_to_remaining says why
    that matters).

    remaining [90, 4, 2, None], k_max 5 -> [5, 2, 0, 5]."""
    return [k_max if left is None else min(k_max, max(0, left - 2)) for left in remaining]


def draft_room(batch_size: int, max_verify_tokens: Optional[int]) -> Optional[int]:
    """Drafts (sum of k_i) a step may take so its verify tokens (sum of k_i + 1) stay
    within ``max_verify_tokens``; None when there is no cap or the batch alone exceeds
    it (that step verifies eagerly whatever the lengths)."""
    if max_verify_tokens is None or batch_size > max_verify_tokens:
        return None
    return max_verify_tokens - batch_size


class LengthPolicy(Protocol):
    def choose(
        self, rids: Sequence[str], k_max: int, context: Optional[StepContext] = None
    ) -> list[int]: ...

    def observe(
        self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]
    ) -> None: ...

    def forget(self, rid: str) -> None: ...

    def step_began(self, started: float, lengths: Sequence[int], context: Optional[StepContext]) -> None:
        """A decode step began at ``started`` (time.perf_counter()) with these final lengths."""

    def prefill_ran(self) -> None:
        """A prefill step ran (between two decode steps)."""


class Untimed:
    """step_began and prefill_ran for policies that do not time their steps."""

    def step_began(self, started: float, lengths: Sequence[int], context: Optional[StepContext]) -> None:
        pass

    def prefill_ran(self) -> None:
        pass


@dataclass
class FixedLengthPolicy(Untimed):
    """Every request drafts K_max tokens (vanilla speculative decoding)."""

    def choose(
        self, rids: Sequence[str], k_max: int, context: Optional[StepContext] = None
    ) -> list[int]:
        return [k_max] * len(rids)

    def observe(self, rids, draft_lens, num_accepted) -> None:
        pass

    def forget(self, rid: str) -> None:
        pass


def step_accept_rate(draft_len: int, num_accepted: int) -> float:
    """Per-token acceptance estimate from one verify of a chain.

    Acceptance is a prefix: a accepted out of k means a successes followed by one
    failure when a < k (a / (a + 1)), or k successes and no failure when a == k.
    """
    if num_accepted < draft_len:
        return num_accepted / (num_accepted + 1)
    return 1.0


@dataclass
class EmaLengthPolicy(Untimed):
    """k_i from an exponential moving average of request i's acceptance rate.

    The expected value of the j-th draft token is rate**j (it counts only if all
    before it are accepted), so k_i is the largest k <= K_max with
    rate**k >= min_token_value; a request whose rate falls below that decodes
    normally (k_i = 0). While a request is not drafting its estimate relaxes
    toward the prior, so it is probed again after a few steps instead of staying
    off forever.
    """

    config: FaserConfig
    rates: dict[str, float] = field(default_factory=dict)

    def _rate(self, rid: str) -> float:
        return self.rates.get(rid, self.config.prior_accept_rate)

    def length_for_rate(self, rate: float, k_max: int) -> int:
        threshold = self.config.min_token_value
        if rate <= 0.0 or rate < threshold:
            return 0
        if rate >= 1.0 or threshold == 0.0:
            return k_max
        return min(k_max, int(math.floor(math.log(threshold) / math.log(rate) + 1e-9)))

    def choose(
        self, rids: Sequence[str], k_max: int, context: Optional[StepContext] = None
    ) -> list[int]:
        return [self.length_for_rate(self._rate(rid), k_max) for rid in rids]

    def observe(
        self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]
    ) -> None:
        alpha = self.config.ema_alpha
        for rid, k, a in zip(rids, draft_lens, num_accepted):
            rate = self._rate(rid)
            if k > 0:
                self.rates[rid] = (1 - alpha) * rate + alpha * step_accept_rate(k, a)
            else:
                self.rates[rid] = rate + alpha * 0.25 * (self.config.prior_accept_rate - rate)

    def forget(self, rid: str) -> None:
        self.rates.pop(rid, None)


@dataclass
class RandomLengthPolicy(Untimed):
    """Random lengths, for profiling step costs (scripts/profile_costs.py).

    Each step draws a cap m uniform in [0, K_max] and every request a k_i uniform in
    [0, m], so one server run times idle steps, short and long steps and mixed
    lengths (the shapes the adaptive policy produces), which a cost model fitted
    only on fixed-length steps could not tell apart. Seeded by the config's ``seed``.
    """

    rng: random.Random

    def choose(
        self, rids: Sequence[str], k_max: int, context: Optional[StepContext] = None
    ) -> list[int]:
        cap = self.rng.randint(0, k_max)
        return [self.rng.randint(0, cap) for _ in rids]

    def observe(self, rids, draft_lens, num_accepted) -> None:
        pass

    def forget(self, rid: str) -> None:
        pass


def make_policy(config: FaserConfig, deployment: Optional[Deployment] = None) -> LengthPolicy:
    """The policy ``config.policy`` names; "adaptive" prices lengths for ``deployment``
    (GPU, models, backend, dtype), which the other policies do not need."""
    if config.policy == "fixed":
        return FixedLengthPolicy()
    if config.policy == "random":
        return RandomLengthPolicy(random.Random(config.seed))
    if config.policy == "adaptive":
        # Imported here: the adaptive package imports StepContext from this module.
        from faser_sglang.spec_worker.adaptive import AdaptiveDrafterPolicy, load_cost_model

        if deployment is None:
            raise ValueError(
                "FASER policy 'adaptive' needs the deployment (GPU, target, draft, attention "
                "backend, dtype) to load its cost model: make_policy(config, deployment)"
            )
        return AdaptiveDrafterPolicy(config, load_cost_model(config, deployment))
    return EmaLengthPolicy(config)
