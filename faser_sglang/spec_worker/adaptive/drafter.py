"""The adaptive drafter: per-request lengths that maximise the batch's tokens per second.

Every step it reads each request's acceptance window (``acceptance``), prices every
draft position with the deployment's step-cost model (``cost_model``) and lets the
allocator (``allocator``) pick all k_i at once. Unlike a per-request threshold it
sees the load: the same acceptance earns long drafts on an idle GPU and none when
verify tokens are compute bound.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.adaptive.acceptance import AcceptanceWindows
from faser_sglang.spec_worker.adaptive.allocator import CatchupPieces, allocate
from faser_sglang.spec_worker.adaptive.calibration import DraftingOverhead
from faser_sglang.spec_worker.adaptive.cost_model import (
    FILE_FORMAT,
    OLDER_FORMATS,
    CostKey,
    CostModel,
    DraftCost,
    VerifyCost,
    analytical,
    lagging,
    read_cost_entries,
)
from faser_sglang.spec_worker.adaptive.hardware import ModelShape, gpu_spec
from faser_sglang.spec_worker.policy import STEADY_CATCHUP, StepContext, draft_caps
from faser_sglang.spec_worker.validation import MAX_DRAFT_LEN

# Steps over which the batch's growth is measured (horizons()): short, so a burst
# shortens the catch-up horizon within a few steps of its start.
GROWTH_WINDOW_STEPS = 4

# step_calibration logs its estimate every this many timed drafting steps.
CALIBRATION_LOG_EVERY = 200

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deployment:
    """What the step cost depends on: the cost-file key, and both models' configs
    (``config.json`` mappings or transformers configs) for the analytical fallback."""

    key: CostKey  # key.dtype is the target's dtype
    target_config: Any
    draft_config: Any
    draft_dtype: str


def deployment_from_runners(server_args: Any, target_runner: Any, draft_runner: Any) -> Deployment:
    """The Deployment of a running worker, from SGLang's ServerArgs and ModelRunners."""
    import torch  # here, so the rest of the adaptive drafter imports without torch

    gpu = torch.cuda.get_device_name(target_runner.gpu_id) if torch.cuda.is_available() else "cpu"
    backend = (
        server_args.attention_backend
        or getattr(target_runner, "prefill_attention_backend_str", None)
        or "auto"
    )
    return Deployment(
        key=CostKey.of(
            gpu=gpu,
            target=server_args.model_path,
            draft=server_args.speculative_draft_model_path,
            attention_backend=backend,
            dtype=target_runner.model_config.dtype,
            draft_attention_backend=getattr(server_args, "speculative_draft_attention_backend", None),
        ),
        target_config=target_runner.model_config.hf_text_config,
        draft_config=draft_runner.model_config.hf_text_config,
        draft_dtype=str(draft_runner.model_config.dtype),
    )


def load_cost_model(config: FaserConfig, deployment: Deployment) -> CostModel:
    """The profiled model for this deployment from ``cost_model_path``, else the
    analytical fallback (logged, since its predictions are rough)."""
    key = deployment.key
    if config.cost_model_path is not None:
        entries, file_format = read_cost_entries(config.cost_model_path)
        model = entries.get(key)
        if model is not None:
            for older in range(file_format, FILE_FORMAT):
                logger.warning(
                    "FASER adaptive: %s %s. Re-profile with scripts/profile_costs.py",
                    config.cost_model_path,
                    OLDER_FORMATS[older],
                )
            logger.info(
                "FASER adaptive: profiled cost model from %s (held-out MAPE %.1f%%, %d steps)",
                config.cost_model_path,
                100 * (model.holdout_mape or 0.0),
                model.num_samples,
            )
            return model
        logger.warning(
            "FASER adaptive: %s has no entry for %s (it has %s)",
            config.cost_model_path,
            key,
            list(entries),
        )
    gpu = gpu_spec(key.gpu)
    logger.warning(
        "FASER adaptive: using the ANALYTICAL cost model (roofline estimate for %s, %s -> %s); "
        "profile this deployment with scripts/profile_costs.py and set cost_model_path",
        gpu.name,
        key.draft,
        key.target,
    )
    return analytical(
        ModelShape.from_config(deployment.target_config, key.dtype),
        ModelShape.from_config(deployment.draft_config, deployment.draft_dtype),
        gpu,
    )


class AdaptiveDrafterPolicy:
    """LengthPolicy: k_i from acceptance windows and a step-cost model (policy "adaptive")."""

    def __init__(self, config: FaserConfig, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.catchup_horizon = config.catchup_horizon
        self._batch_sizes: deque[int] = deque(maxlen=GROWTH_WINDOW_STEPS + 1)  # of the latest steps
        self.acceptance = AcceptanceWindows(
            window=config.window,
            positions=MAX_DRAFT_LEN,
            base_rate=config.prior_accept_rate,
            prior_strength=config.prior_strength,
            pool_prior_strength=config.pool_prior_strength,
        )
        # None: drafting steps are priced by the cost model alone.
        self.overhead = DraftingOverhead() if config.step_calibration else None
        compile_kernels()

    def choose(self, rids: Sequence[str], k_max: int, context: Optional[StepContext] = None) -> list[int]:
        if context is None:
            raise ValueError(
                "FASER policy 'adaptive' prices lengths with the batch's context lengths: "
                "pass a StepContext to choose()"
            )
        if len(context.seq_lens) != len(rids):
            raise ValueError(
                f"StepContext describes {len(context.seq_lens)} requests, the step has {len(rids)}"
            )
        if not rids:
            return []
        self._batch_sizes.append(len(rids))
        catchup = np.asarray(context.catchup_tokens(), np.float64)  # [bs]
        gains = self.acceptance.gains(rids, k_max)  # [bs, k_max]
        # Uncapped gains: the fewest steps a request can still live (its last ones plain).
        horizon = self.horizons(context, gains)  # [bs]
        if context.remaining_tokens is not None:
            # Drafts the worker would cut near max_new_tokens gain nothing: priced as
            # such, they do not draw a draft forward that only the cut request needed.
            caps = np.asarray(draft_caps(context.remaining_tokens, k_max))  # [bs]
            gains = np.where(np.arange(k_max)[None, :] < caps[:, None], gains, 0.0)
        pieces = None  # all catch-ups together fit one forward: no piece to price
        if context.catchup_piece_tokens is not None and catchup.sum() > context.catchup_piece_tokens:
            pieces = CatchupPieces(catchup, context.catchup_piece_tokens, horizon)
        allocation = allocate(
            gains,
            np.asarray(context.seq_lens),
            charged_catchup(catchup, horizon),
            self.cost_model,
            max_drafts=context.max_drafts(),
            pieces=pieces,
            drafting_overhead=0.0 if self.overhead is None else self.overhead.seconds,
            chained=context.chained,
            lag_weights=lag_weights(catchup, horizon),
        )
        return list(allocation.draft_lens)

    def step_began(self, started: float, lengths: Sequence[int], context: Optional[StepContext]) -> None:
        """Times drafting steps against the cost model (step_calibration)."""
        if self.overhead is None or context is None:
            return
        predicted = None
        if any(lengths):  # its whole catch-up runs this step, not the charged share
            predicted = self.cost_model.step_time(
                lengths, context.seq_lens, context.catchup_tokens(), context.catchup_piece_tokens, context.chained
            )
        if self.overhead.step(started, predicted) and self.overhead.measured % CALIBRATION_LOG_EVERY == 0:
            logger.info(
                "FASER adaptive: drafting steps take %.2f ms more than the cost model predicts "
                "(median of the latest %d of %d timed); priced from now on",
                1e3 * self.overhead.seconds, len(self.overhead.excess), self.overhead.measured,
            )  # fmt: skip

    def prefill_ran(self) -> None:
        if self.overhead is not None:
            self.overhead.prefill()

    def horizons(self, context: StepContext, gains: np.ndarray) -> np.ndarray:
        """[bs] steps over which each request's catch-up backlog is charged: the steps
        it can expect to keep drafting.

        ``catchup_horizon``, shortened while the batch grows: a batch of B requests that
        grew by g per step over the latest GROWTH_WINDOW_STEPS steps doubles in B / g
        steps, and drafting that pays at B rarely pays at 2B, so the horizon is
        1 / (1 / catchup_horizon + g / B) (16 steps at a steady batch; 4.4 at 12 requests
        growing by 2 a step). Without it a burst arriving while requests draft makes
        every newcomer's prompt catch-up look cheap, charged over 16 steps of drafting
        that the growing batch soon switches off (scripts/simulate_policy.py --ramp).
        Fewer still for a request that has fewer steps left: with n tokens left to emit
        and gains g ([bs, K]) it lives at least n / (1 + sum_j g[j]) more steps (each
        emitting as many tokens as its longest draft would, in expectation)."""
        bs = len(context.seq_lens)
        sizes = self._batch_sizes  # of the latest steps, this one's last
        growth = max(sizes[-1] - sizes[0], 0) / (len(sizes) - 1) if len(sizes) > 1 else 0.0  # requests per step
        horizon = np.full(bs, 1.0 / (1.0 / self.catchup_horizon + growth / bs))
        if context.remaining_tokens is not None:
            left = np.array([np.inf if n is None else n for n in context.remaining_tokens], np.float64)
            horizon = np.clip(left / (1.0 + gains.sum(axis=1)), 1.0, horizon)
        return horizon

    def observe(self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]) -> None:
        self.acceptance.observe(rids, draft_lens, num_accepted)

    def forget(self, rid: str) -> None:
        self.acceptance.forget(rid)


def charged_catchup(tokens: np.ndarray, horizon: np.ndarray | float) -> np.ndarray:
    """[bs] catch-up tokens charged to this step for each request ([bs] ``tokens``).

    A request's usual catch-up (up to STEADY_CATCHUP tokens) is the step's own cost. A
    backlog beyond it (a lazy prefill's whole prompt, the tokens of plain-decode
    steps) is paid once and then lets the request draft step after step, so the
    step is charged 1/``horizon`` of it ([bs] or one for all). Charged in full, a
    300-token prompt at 26 us per token (the 0.42B draft on an H200) would outweigh
    one step's expected gain and the request would never draft, however well its
    drafts would be accepted.
    """
    tokens = np.asarray(tokens, np.float64)
    steady = np.minimum(tokens, STEADY_CATCHUP)
    return steady + (tokens - steady) / horizon


def lag_weights(tokens: np.ndarray, horizon: np.ndarray | float) -> np.ndarray:
    """[bs] share of the chain step a lagging request adds (cost_model.chain_lags) that
    this step is charged, from its catch-up ``tokens``: all of it for a lag of one
    token (STEADY_CATCHUP, after a step that accepted every draft: it recurs, step
    after step), 1/``horizon`` for a backlog (a request resuming after plain steps pays
    it once, like its backlog's tokens: ``charged_catchup``), none without a lag.

    tokens [1, 2, 9], horizon 16 -> [0, 1, 0.0625]"""
    tokens = np.asarray(tokens, np.float64)
    backlog = np.broadcast_to(1.0 / np.asarray(horizon, np.float64), tokens.shape)
    return np.where(tokens > STEADY_CATCHUP, backlog, lagging(tokens).astype(np.float64))


def compile_kernels() -> None:
    """Compile the acceptance windows' and the allocator's numba kernels now, or load
    them from numba's on-disk cache, so the first decode step does not pay for it: a
    cold compile takes ~10 s on a 2-core CPU, a cached load a few milliseconds. Runs
    every kernel once, on a batch whose drafts pay (so the walks run) and whose
    catch-ups come in pieces, with the argument types the policy passes."""
    started = time.perf_counter()
    windows = AcceptanceWindows(window=2, positions=2, base_rate=0.9, prior_strength=1.0, pool_prior_strength=1.0)
    windows.observe(["a", "b"], [2, 0], [1, 0])
    gains = windows.gains(["a", "b"], 2)  # [2, 2]
    cheap = CostModel(DraftCost(1e-6, 1e-6, 0.0, 0.0, 0.0), VerifyCost(1e-3, 0.0, 0.0, 0.0), "synthetic")
    catchup = np.array([2.0, 9.0])
    allocate(gains, np.array([300, 10]), catchup, cheap, max_drafts=3, pieces=CatchupPieces(catchup, 4, np.ones(2)))
    seconds = time.perf_counter() - started
    if seconds > 1.0:
        logger.info("FASER adaptive: compiled the policy's kernels in %.1f s (cached for later starts)", seconds)
