"""FASER settings beyond SGLang's own flags.

One file (JSON or TOML) named by the ``FASER_CONFIG`` environment variable, parsed
into a frozen dataclass. Unknown keys and bad values are rejected with a
``ValueError`` that names the key, so a typo fails at startup instead of silently
running with defaults. Every field has a working default: no file is needed.

The maximum speculative length is SGLang's ``--speculative-num-steps`` (K_max), not a
field here, so the two cannot disagree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Optional

CONFIG_ENV = "FASER_CONFIG"

POLICIES = ("ema", "fixed", "adaptive", "random")
CHUNK_FORWARDS = ("auto", "decode_rows", "extend")
DRAFT_PREFILLS = ("auto", "eager", "lazy")


@dataclass(frozen=True)
class FaserConfig:
    # Length policy: "ema" (per-request acceptance EMA -> k_i), "fixed" (k_i = K_max),
    # "adaptive" (cost model + acceptance windows -> k_i maximising batch tokens/s) or
    # "random" (random k_i every step; for profiling step costs, not for serving).
    policy: str = "ema"
    # EMA weight of the newest step's acceptance rate, in (0, 1].
    ema_alpha: float = 0.3
    # Acceptance-rate prior for a request that has not been verified yet, in [0, 1]
    # (the adaptive policy's pooled prior starts here before any request is verified).
    prior_accept_rate: float = 0.7
    # The ema policy drafts while the expected marginal accepted token is worth more
    # than this, in [0, 1): k_i = largest k with rate**k >= min_token_value.
    min_token_value: float = 0.25
    # Adaptive policy: how many of a request's latest verify steps estimate its
    # per-position acceptance, >= 1.
    window: int = 16
    # Adaptive policy: weight of the pooled prior, in pseudo-observations per draft
    # position, > 0 (larger: slower to trust a request's own window).
    prior_strength: float = 2.0
    # Adaptive policy: weight of prior_accept_rate in the pooled prior, in
    # pseudo-observations per draft position, > 0 (larger: the pool needs more verifies
    # to move away from it). Not smaller than a batch's worth of evidence, so that one
    # unlucky first batch cannot switch drafting off until its verifies age out.
    pool_prior_strength: float = 8.0
    # Adaptive policy: steps over which a catch-up backlog is charged, >= 1. A request
    # whose draft lags (a lazy prefill's prompt, tokens of plain-decode steps) pays its
    # backlog once and then drafts on; charging all of it to one step would keep such a
    # request from ever drafting. 1: charge it all to the step that pays it. A request
    # near its max_new_tokens is charged over fewer: the steps it has left at least.
    catchup_horizon: int = 16
    # Adaptive policy: JSON cost file written by scripts/profile_costs.py; None (or no
    # entry for this GPU/models/backend/dtype) uses the analytical roofline estimate.
    cost_model_path: Optional[str] = None
    # Write one JSON line per decode step (per-request lengths and acceptances) here.
    trace_path: Optional[str] = None
    # Seed of the acceptance RNG (rejection sampling); None draws from torch's global RNG.
    seed: Optional[int] = None
    # How the verify and the draft's catch-up feed several tokens per request:
    # "decode_rows" (one decode row per token, replayed from CUDA graphs), "extend" (one
    # EXTEND forward, eager) or "auto" (decode rows whenever the model's decode CUDA
    # graphs fit them). spec_worker/chunk_forward.py explains both.
    chunk_forward: str = "auto"
    # When the draft model reads a new request's prompt: "eager" (in the prefill step,
    # next to the target), "lazy" (only when the request first drafts: its catch-up
    # feeds the whole sequence, a cost the adaptive policy prices, and a request that
    # never drafts never runs the draft) or "auto" (lazy for the adaptive policy, eager
    # for the others).
    draft_prefill: str = "auto"
    # Adaptive policy: measure what each drafting step costs in the scheduler's loop
    # beyond the cost model (adaptive/calibration.py) and add the median excess of the
    # latest drafting steps to every drafting configuration's price.
    step_calibration: bool = False
    # Run a step's draft forwards as one chain: one multi-step attention plan, replayed
    # as one CUDA graph where decode CUDA graphs run (spec_worker/draft_chain.py).
    # false: one forward per draft step.
    draft_chain: bool = True
    # Chain steps where sampling or logit-biased requests draft too (with draft_chain): a
    # second set of chain graphs, captured up to 64 rows (larger such batches draft one
    # forward at a time), and their [rows, K_max + 1, V] float32 buffer of the drafts'
    # distributions (297 MiB at 64 rows, K_max = 7, a 152k vocabulary; 37 MiB more for
    # the bias). false: such steps draft one forward at a time.
    sampled_chain: bool = True
    # Queue each step's draft chain at the end of the step before, behind its acceptance,
    # so a step that drafted ahead only verifies (spec_worker/draft_ahead.py). Batches
    # without logprobs; sampling or logit-biased rows need sampled_chain. Needs
    # draft_chain, K_max >= 2 and a draft attention backend that plans on the device
    # (--speculative-draft-attention-backend triton on a GPU). SGLang then reserves
    # 3 K_max + 3 KV slots per request and step instead of 2 K_max + 2.
    draft_ahead: bool = False

    @property
    def lazy_draft_prefill(self) -> bool:
        if self.draft_prefill == "auto":
            return self.policy == "adaptive"
        return self.draft_prefill == "lazy"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"FASER config 'policy' must be one of {POLICIES}, got {self.policy!r}")
        if self.chunk_forward not in CHUNK_FORWARDS:
            raise ValueError(
                f"FASER config 'chunk_forward' must be one of {CHUNK_FORWARDS}, got {self.chunk_forward!r}"
            )
        if self.draft_prefill not in DRAFT_PREFILLS:
            raise ValueError(
                f"FASER config 'draft_prefill' must be one of {DRAFT_PREFILLS}, got {self.draft_prefill!r}"
            )
        _check_range("ema_alpha", self.ema_alpha, 0.0, 1.0, low_open=True)
        _check_range("prior_accept_rate", self.prior_accept_rate, 0.0, 1.0)
        _check_range("min_token_value", self.min_token_value, 0.0, 1.0, high_open=True)
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"FASER config 'window' must be an integer >= 1, got {self.window!r}")
        _check_range("prior_strength", self.prior_strength, 0.0, math.inf, low_open=True, high_open=True)
        _check_range(
            "pool_prior_strength", self.pool_prior_strength, 0.0, math.inf, low_open=True, high_open=True
        )
        if (
            isinstance(self.catchup_horizon, bool)
            or not isinstance(self.catchup_horizon, int)
            or self.catchup_horizon < 1
        ):
            raise ValueError(
                f"FASER config 'catchup_horizon' must be an integer >= 1, got {self.catchup_horizon!r}"
            )
        _check_cost_model_path(self.cost_model_path)
        _check_trace_path(self.trace_path)
        if not isinstance(self.step_calibration, bool):
            raise ValueError(f"FASER config 'step_calibration' must be true or false, got {self.step_calibration!r}")
        if not isinstance(self.draft_chain, bool):
            raise ValueError(f"FASER config 'draft_chain' must be true or false, got {self.draft_chain!r}")
        if not isinstance(self.sampled_chain, bool):
            raise ValueError(f"FASER config 'sampled_chain' must be true or false, got {self.sampled_chain!r}")
        if not isinstance(self.draft_ahead, bool):
            raise ValueError(f"FASER config 'draft_ahead' must be true or false, got {self.draft_ahead!r}")
        if self.draft_ahead and not self.draft_chain:
            raise ValueError(
                "FASER config 'draft_ahead' drafts the next step as one chain: it needs 'draft_chain' "
                "true (or set draft_ahead false)"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"FASER config 'seed' must be an integer, got {self.seed!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "FASER config") -> "FaserConfig":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"{source}: unknown key(s) {unknown}; valid keys are {sorted(known)}"
            )
        return cls(**dict(data))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "FaserConfig":
        p = Path(path)
        if not p.is_file():
            raise ValueError(
                f"{CONFIG_ENV}={str(path)!r} does not name a file; point it at a JSON or "
                "TOML FASER config, or unset it to use the defaults"
            )
        text = p.read_text()
        try:
            data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"FASER config {p}: cannot parse ({e})") from e
        if not isinstance(data, dict):
            raise ValueError(f"FASER config {p}: top level must be a table/object")
        return cls.from_mapping(data, source=f"FASER config {p}")

    @classmethod
    def from_env(cls) -> "FaserConfig":
        """The config named by ``FASER_CONFIG``, or the defaults when it is unset."""
        path = os.environ.get(CONFIG_ENV)
        return cls.from_file(path) if path else cls()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_trace_path(path: Any) -> None:
    # Checked at startup: the trace file is opened on the first decode step, where a
    # bad path would take the server down instead of refusing to start.
    if path is None:
        return
    if not isinstance(path, str):
        raise ValueError(f"FASER config 'trace_path' must be a string path, got {path!r}")
    parent = Path(path).resolve().parent
    if Path(path).is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(
            f"FASER config 'trace_path' = {path!r} is not a writable file path (its directory "
            "must exist and be writable); fix the path or remove the key"
        )


def _check_cost_model_path(path: Any) -> None:
    if path is None:
        return
    if not isinstance(path, str):
        raise ValueError(f"FASER config 'cost_model_path' must be a string path, got {path!r}")
    if not Path(path).is_file():
        raise ValueError(
            f"FASER config 'cost_model_path' = {path!r} is not a file. Create it on this GPU "
            "with scripts/profile_costs.py --out PATH, or remove the key to use the "
            "analytical cost model."
        )


def _check_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"FASER config {name!r} must be a finite number, got {value!r}")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"FASER config {name!r} must be in {lo}{low}, {high}{hi}, got {value!r}")
