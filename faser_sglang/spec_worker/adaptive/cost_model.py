"""Predicted seconds of one FASER decode step, as a function of the chosen lengths.

A step is a draft phase then a verify phase (see ``spec_worker.draft`` / ``verify``):

    T(k) = draft_time(k) + verify_time(k)

    draft_time  = F * extend_forward                the catch-up's forwards (F, below)
                + max(m - 1, 0) * decode_forward    DECODE forwards for drafts 2..m
                + sum_i max(k_i - 1, 0) * row_step  requests in those DECODE forwards
                + sum_{k_i > 0} c_i * catchup_token tokens the catch-up feeds (c_i per request)
                + sum_i k_i L_i * context_row_step  draft KV read: L_i context per forward

    verify_time = fixed + bs * row + N * token + C * context_token
                + sum_b slope_b * max(0, N - knot_b)

with N = sum_i (k_i + 1) verify tokens, C = sum_i L_i committed tokens, m = max_i k_i,
and F = 0 when nobody drafts, else the forwards the catch-up of c = sum_{k_i > 0} c_i
tokens is priced as: ceil(c / piece tokens) decode-row pieces, at most
MAX_CATCHUP_PIECES (policy.catchup_forwards; one when the step has no piece size). A
longer catch-up runs as one eager EXTEND, which on the profiled H200 costs about as
much as that many pieces; profiles and prices count it the same way (the trace
records each step's piece size), so a fit never prices one thing two ways. The hinge
terms make verify time piecewise linear and convex in N: flat-ish while the target
forward is bound by reading its weights, steeper once the GEMMs become compute
bound. The allocator prices the per-request terms per draft position, the forward
counts as whole forwards (a deeper maximum, a catch-up past a piece boundary).

A step's draft forwards for drafts 2..m run as one chain (``spec_worker/draft_chain.py``)
in which every drafting request runs to m, so there the two per-request terms are

    row_step         * n (m - 1)                  n = requests with k_i > 0
    context_row_step * m * sum_{k_i > 0} L_i

(``chained``): a draft below the step's longest costs its request no draft forward,
only its verify token; the step's longest draft costs every drafting row one more
step. The trace says which way each profiled step ran (``draft_steps``), so one fit
serves both. When no drafting row lags its committed length by more than
MAX_FORCED_GAP tokens, the chain feeds the catch-up itself (draft.py): the catch-up
forward priced as F = 1 is then the chain's first forward, which a profile of such
steps fits at what it costs. When some drafting row lags (c_i >= STEADY_CATCHUP), a
chain of m > 1 runs one forward more, priced as one more decode forward with every
drafting row in it (m -> m + 1 above): the chain feeds that row's committed token
before its bonus token, or a longer lag takes a catch-up forward of its own.

A step in which nobody drafts is not a verify: the worker runs it as a plain decode
through SGLang's own model worker (``VerifyPhase.plain_decode``), which costs less
than the verify path at N = bs (no ragged layout, no acceptance). When the profile
holds such steps it has its own term,

    plain_time  = fixed + bs * row + C * context_token
                  + sum_b slope_b * max(0, bs - knot_b)          (all k_i = 0)

so the first draft of a step is priced against the decode it replaces, not against
a zero-length verify; without it (older cost files, the analytical estimate) an
all-zero step is priced as a verify with N = bs. A plain decode of bs requests is
the target forward a verify of N = bs tokens runs, less the verify path's own work,
so ``fit`` takes its row, context and knot prices from the verify (row + token,
context_token, the knots at N = bs) and fits only its fixed term. Fitted freely, the
row and context prices would not be identified: a profile's plain steps have contexts
that grow with the batch, and on the 13.5B pair's H200 profile the free fit put the
batch's cost on the context (0.26 us per token), which predicted 26 ms for a plain
step of 128 requests of 500 tokens, twice the verify of the same batch, so drafting
looked free at high load.
In those profiles verify(N = bs) - plain is flat in bs (1.26-1.35 ms at 1-64
requests; 1.75-2.05 ms in another), which is what the tie assumes.

Coefficients come from one of two places:
- ``fit``: non-negative least squares on profiled steps (scripts/profile_costs.py),
  rows weighted by 1 / step time so the fit minimises relative error, with the
  mean absolute percentage error (MAPE) on held-out steps stored next to them.
  Non-negative coefficients keep every marginal cost >= 0 and the verify curve
  convex, which the allocator relies on.
- ``analytical``: a roofline estimate from the models' configs and GPU datasheet
  numbers, used when no profiled file matches the deployment.

Profiled models live in one JSON file with an entry per ``CostKey`` (GPU, target,
draft, attention backend, dtype), so one file can serve several deployments.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from scipy.optimize import nnls

from faser_sglang.spec_worker.adaptive.hardware import (
    BANDWIDTH_EFFICIENCY,
    EAGER_SECONDS_PER_LAYER,
    FLOPS_EFFICIENCY,
    GpuSpec,
    ModelShape,
)
from faser_sglang.spec_worker.policy import STEADY_CATCHUP, catchup_forwards

FILE_FORMAT = 3
# Older formats still load, with a warning to re-profile (OLDER_FORMATS says why).
OLDEST_FILE_FORMAT = 1
OLDER_FORMATS = {
    # Fitted before catch-ups ran in pieces: a catch-up past the draft's CUDA graphs was
    # one eager EXTEND counted as one forward, so the catch-up terms carry part of its cost.
    1: "predates draft catch-ups in decode-row pieces (its catch-up costs include eager EXTEND catch-ups)",
    # Plain-decode term fitted freely, not tied to the verify: it can price plain decoding
    # at high load far above the verify of the same batch (module docstring).
    2: "has a plain-decode term fitted apart from the verify (it may overprice plain decoding at high load)",
}
# Verify-token counts where the verify slope may change (filtered to the profiled range).
DEFAULT_KNOTS = (128, 256, 512, 1024, 2048, 4096)
# Per-step trace fields a profiled sample needs (draft_seconds is optional).
TRACE_KEYS = ("draft_lens", "seq_lens", "draft_kv_lens", "seconds")
# A trace's draft_steps values of steps whose draft steps ran as one chain (DraftOutput.steps).
CHAINED_STEPS = ("chain", "graph")
# Fewest training steps without drafts that get their own plain term.
MIN_PLAIN_SAMPLES = 8


@dataclass(frozen=True)
class DraftCost:
    """Seconds per unit of each draft-phase feature (see the module docstring)."""

    extend_forward: float  # per catch-up forward (the name predates decode-row catch-ups)
    decode_forward: float
    row_step: float
    catchup_token: float
    context_row_step: float


@dataclass(frozen=True)
class VerifyCost:
    """Seconds per unit of each verify-phase feature; knot_slopes[b] applies past knots[b]."""

    fixed: float
    row: float
    token: float
    context_token: float
    knots: tuple[float, ...] = ()
    knot_slopes: tuple[float, ...] = ()

    def time(self, batch_size: int, tokens: Any, context: float) -> Any:
        """Verify seconds; ``tokens`` may be a scalar or an array (then so is the result)."""
        tokens = np.asarray(tokens, np.float64)
        t = self.fixed + self.row * batch_size + self.token * tokens + self.context_token * context
        t = t + _hinges(tokens, self.knots, self.knot_slopes)
        return t if t.ndim else float(t)


@dataclass(frozen=True)
class PlainCost:
    """Seconds per unit of each feature of a step in which nobody drafts (plain decode);
    knot_slopes[b] applies per request past knots[b] (the verify's, at N = bs)."""

    fixed: float
    row: float
    context_token: float
    knots: tuple[float, ...] = ()
    knot_slopes: tuple[float, ...] = ()

    def time(self, batch_size: int, context: float) -> float:
        t = self.fixed + self.row * batch_size + self.context_token * context
        return float(t + _hinges(np.float64(batch_size), self.knots, self.knot_slopes))


def _hinges(x: Any, knots: Sequence[float], slopes: Sequence[float]) -> Any:
    """sum_b slopes[b] * max(x - knots[b], 0), elementwise over ``x`` (a scalar or an array)."""
    t = np.zeros_like(x, np.float64)
    for knot, slope in zip(knots, slopes):
        t = t + slope * np.maximum(x - knot, 0.0)
    return t


@dataclass(frozen=True)
class CostModel:
    draft: DraftCost
    verify: VerifyCost
    source: str  # "profiled" or "analytical"
    holdout_mape: Optional[float] = None  # profiled only: MAPE of step time on held-out steps
    num_samples: int = 0  # profiled only: steps the fit and the MAPE used
    plain: Optional[PlainCost] = None  # steps without drafts; None: priced as a verify

    def no_draft_time(self, seq_lens: Sequence[int]) -> float:
        """Seconds of a step in which none of the ``len(seq_lens)`` requests drafts."""
        if self.plain is None:
            return self.verify_time([0] * len(seq_lens), seq_lens)
        return self.plain.time(len(seq_lens), float(np.sum(seq_lens)))

    def draft_time(
        self,
        draft_lens: Sequence[int],
        seq_lens: Sequence[int],
        catchup: Sequence[int],
        piece_tokens: Optional[int] = None,  # catch-up tokens per draft forward (None: one forward)
        chained: bool = False,  # draft forwards as one chain: every drafting row runs to m
    ) -> float:
        features = _draft_features(draft_lens, seq_lens, catchup, piece_tokens, chained)
        return float(np.dot(features, _draft_vector(self.draft)))

    def verify_time(self, draft_lens: Sequence[int], seq_lens: Sequence[int]) -> float:
        return self.verify.time(len(draft_lens), sum(draft_lens) + len(draft_lens), float(sum(seq_lens)))

    def step_time(
        self,
        draft_lens: Sequence[int],
        seq_lens: Sequence[int],
        catchup: Sequence[int],
        piece_tokens: Optional[int] = None,
        chained: bool = False,
    ) -> float:
        """Predicted seconds of a step with lengths ``draft_lens`` ([bs] each sequence)."""
        if not any(draft_lens):
            return self.no_draft_time(seq_lens)
        draft = self.draft_time(draft_lens, seq_lens, catchup, piece_tokens, chained)
        return draft + self.verify_time(draft_lens, seq_lens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        verify = dict(data["verify"])
        verify["knots"] = tuple(verify.get("knots", ()))
        verify["knot_slopes"] = tuple(verify.get("knot_slopes", ()))
        plain = data.get("plain")
        if plain is not None:  # a plain term written without knots has none
            plain = dict(plain)
            plain["knots"] = tuple(plain.get("knots", ()))
            plain["knot_slopes"] = tuple(plain.get("knot_slopes", ()))
        terms = {"draft": data["draft"], "verify": verify, "plain": plain or {}}
        for part, values in terms.items():
            for name, value in values.items():
                # The allocator's bounds and walks take every price to be >= 0 (fits are).
                if any(v < 0 for v in np.atleast_1d(np.asarray(value, np.float64))):
                    raise ValueError(
                        f"cost model term {part}.{name} = {value!r} is negative; costs are seconds "
                        "(>= 0): re-profile with scripts/profile_costs.py"
                    )
        return cls(
            draft=DraftCost(**data["draft"]),
            verify=VerifyCost(**verify),
            source=data["source"],
            holdout_mape=data.get("holdout_mape"),
            num_samples=int(data.get("num_samples", 0)),
            plain=None if plain is None else PlainCost(**plain),
        )


# Profiled samples and the fit ------------------------------------------------


@dataclass(frozen=True)
class StepSample:
    """One timed decode step, as the worker's trace records it."""

    draft_lens: tuple[int, ...]  # [bs]
    seq_lens: tuple[int, ...]  # [bs] committed lengths at the step's start
    catchup: tuple[int, ...]  # [bs] tokens the catch-up forward feeds each request if it drafts
    seconds: float  # whole step
    draft_seconds: Optional[float] = None  # draft phase alone, when the trace has it
    piece_tokens: Optional[int] = None  # catch-up tokens per draft forward (older traces: None)
    chained: bool = False  # its draft steps ran as one chain (older traces: never)

    @classmethod
    def from_trace_record(cls, record: Mapping[str, Any]) -> "StepSample":
        missing = [k for k in TRACE_KEYS if k not in record]
        if missing:
            raise ValueError(
                f"trace record lacks {missing}: profiling needs the worker to record, per step, "
                "seq_lens and draft_kv_lens at the step's start (and draft_seconds if it can)"
            )
        seq = tuple(int(n) for n in record["seq_lens"])
        kv = tuple(int(d) for d in record["draft_kv_lens"])
        draft_seconds = record.get("draft_seconds")
        return cls(
            draft_lens=tuple(int(k) for k in record["draft_lens"]),
            seq_lens=seq,
            catchup=tuple(n - d + 1 for n, d in zip(seq, kv)),
            seconds=float(record["seconds"]),
            draft_seconds=None if draft_seconds is None else float(draft_seconds),
            piece_tokens=_optional_int(record.get("catchup_piece_tokens")),
            chained=record.get("draft_steps") in CHAINED_STEPS,
        )


def fit(
    samples: Sequence[StepSample],
    knots: Sequence[float] = DEFAULT_KNOTS,
    holdout_fraction: float = 0.2,
    seed: int = 0,
) -> CostModel:
    """Fit a profiled CostModel on a random (1 - holdout_fraction) of ``samples``.

    Steps in which nobody drafted (plain decodes) get their own term when the training
    part holds at least MIN_PLAIN_SAMPLES of them; the draft and verify terms are fitted
    on the steps that drafted. With ``draft_seconds`` on every such sample the two
    phases are fitted separately (verify time = step time - draft time, so bookkeeping
    around the forwards is billed to verify); otherwise one joint fit of step time on
    both feature sets. The returned model is the one the held-out MAPE (over all
    held-out steps, plain ones included) was measured on.
    """
    n = len(samples)
    if n < 20:
        raise ValueError(f"need at least 20 profiled steps to fit a cost model, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    n_hold = max(1, int(round(n * holdout_fraction)))
    hold, train = order[:n_hold], order[n_hold:]
    seconds = np.array([s.seconds for s in samples])  # [n]
    weight = 1.0 / seconds  # relative error: fast and slow steps count alike
    no_draft = np.array([not any(s.draft_lens) for s in samples])  # [n]
    plain_rows = train[no_draft[train]]
    if len(plain_rows) >= MIN_PLAIN_SAMPLES:
        train = train[~no_draft[train]]

    tokens = np.array([sum(s.draft_lens) + len(s.draft_lens) for s in samples], np.float64)
    # A knot past every training point has no data to fit its slope.
    knots = tuple(float(b) for b in knots if b < tokens[train].max())
    x_draft = np.array(
        [_draft_features(s.draft_lens, s.seq_lens, s.catchup, s.piece_tokens, s.chained) for s in samples]
    )  # [n, 5]
    x_verify = np.array([_verify_features(s.draft_lens, s.seq_lens, knots) for s in samples])  # [n, 4+B]
    if all(samples[i].draft_seconds is not None for i in train):
        draft_seconds = np.array([np.nan if s.draft_seconds is None else s.draft_seconds for s in samples])
        c_draft = _nnls(x_draft[train], draft_seconds[train], weight[train])
        c_verify = _nnls(x_verify[train], (seconds - draft_seconds)[train], weight[train])
    else:
        joint = _nnls(np.hstack([x_draft, x_verify])[train], seconds[train], weight[train])
        c_draft, c_verify = joint[: x_draft.shape[1]], joint[x_draft.shape[1] :]
    verify = VerifyCost(
        *(float(c) for c in c_verify[:4]),
        knots=knots,
        knot_slopes=tuple(float(c) for c in c_verify[4:]),
    )
    plain = None
    if len(plain_rows) >= MIN_PLAIN_SAMPLES:
        plain = _fit_plain([samples[i].seq_lens for i in plain_rows], seconds[plain_rows], verify)
    model = CostModel(draft=DraftCost(*(float(c) for c in c_draft)), verify=verify, source="profiled", plain=plain)
    held_out = [samples[i] for i in hold]
    predicted = np.array([sample_time(model, s) for s in held_out])
    mape = float(np.mean(np.abs(predicted - seconds[hold]) / seconds[hold]))
    return replace(model, holdout_mape=mape, num_samples=n)


def sample_time(model: CostModel, sample: StepSample) -> float:
    """The model's prediction of a profiled step."""
    return model.step_time(sample.draft_lens, sample.seq_lens, sample.catchup, sample.piece_tokens, sample.chained)


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _catchup_total(draft_lens: Sequence[int], catchup: Sequence[int]) -> float:
    """Tokens the catch-up feeds: the drafting requests' c_i."""
    return float(sum(c for k, c in zip(draft_lens, catchup) if k > 0))


def _fit_plain(seq_lens: Sequence[Sequence[int]], seconds: np.ndarray, verify: VerifyCost) -> PlainCost:
    """The plain term from steps without drafts ([p] ``seq_lens``, ``seconds``): row and
    context prices of the verify at N = bs (the module docstring says why), and the
    fixed term minimising the relative error, sum_i ((fixed + a_i - t_i) / t_i)^2."""
    tied = PlainCost(0.0, verify.row + verify.token, verify.context_token, verify.knots, verify.knot_slopes)
    slopes = np.array([tied.time(len(s), float(sum(s))) for s in seq_lens])  # [p] a_i
    weight = seconds**-2.0
    fixed = float(np.sum(weight * (seconds - slopes)) / np.sum(weight))
    return replace(tied, fixed=max(fixed, 0.0))


def _draft_features(
    draft_lens: Sequence[int],
    seq_lens: Sequence[int],
    catchup: Sequence[int],
    piece_tokens: Optional[int],
    chained: bool = False,
) -> np.ndarray:
    """[5] in DraftCost's field order."""
    k = np.asarray(draft_lens, np.float64)
    m = k.max(initial=0.0)
    forwards = catchup_forwards(_catchup_total(draft_lens, catchup), piece_tokens) if m > 0 else 0
    if chained:  # every drafting row runs to m, one step further when one of them lags
        if m > 1 and chain_lags(draft_lens, catchup):
            m += 1
        k = np.where(k > 0, m, 0.0)
    return np.array(
        [
            float(forwards),
            max(m - 1.0, 0.0),
            np.maximum(k - 1.0, 0.0).sum(),
            np.asarray(catchup, np.float64)[k > 0].sum(),
            float(np.dot(k, np.asarray(seq_lens, np.float64))),
        ]
    )


def lagging(catchup: Sequence[float]) -> np.ndarray:
    """[bs] whether each request's catch-up feeds a committed token before its bonus
    token (c_i >= STEADY_CATCHUP: its draft KV lags its committed length)."""
    return np.asarray(catchup, np.float64) >= STEADY_CATCHUP


def chain_lags(draft_lens: Sequence[int], catchup: Sequence[float]) -> bool:
    """Whether a drafting row lags (``lagging``), which costs a chain one forward more:
    the chain feeds that token itself (draft.py), or, past MAX_FORCED_GAP, a catch-up
    forward of its own does."""
    return bool(np.any(lagging(catchup) & (np.asarray(draft_lens) > 0)))


def _verify_features(
    draft_lens: Sequence[int], seq_lens: Sequence[int], knots: Sequence[float]
) -> np.ndarray:
    """[4 + len(knots)]: 1, bs, N, C, then max(0, N - knot) per knot."""
    bs = len(draft_lens)
    tokens = float(sum(draft_lens) + bs)
    hinges = [max(tokens - b, 0.0) for b in knots]
    return np.array([1.0, float(bs), tokens, float(sum(seq_lens)), *hinges])


def _draft_vector(cost: DraftCost) -> np.ndarray:
    return np.array([getattr(cost, f.name) for f in fields(DraftCost)])


def _nnls(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """argmin_{c >= 0} || weight * (x c - y) ||, columns scaled for conditioning."""
    xw = x * weight[:, None]
    scale = np.abs(xw).max(axis=0)
    scale[scale == 0] = 1.0  # a feature that never occurs keeps a zero coefficient
    coef, _ = nnls(xw / scale, y * weight)
    return coef / scale


# The analytical fallback -----------------------------------------------------


def analytical(target: ModelShape, draft: ModelShape, gpu: GpuSpec) -> CostModel:
    """A roofline estimate for when the deployment has not been profiled.

    Each forward costs a launch overhead (EAGER_SECONDS_PER_LAYER per layer) plus
    max(weight bytes / bandwidth, 2 * params * tokens / FLOP/s), with bandwidth and
    FLOP/s at BANDWIDTH_EFFICIENCY / FLOPS_EFFICIENCY of the datasheet, and reads
    its KV (kv bytes per token * context / bandwidth). For the verify forward the max
    is exactly the hinge at knot = weight time / per-token GEMM time; draft forwards
    are assumed weight-bound (small drafts at serving batch sizes), with the GEMM
    time per token added as the per-row / per-catch-up-token cost. Typical error is
    tens of percent; it gets the regimes (weight-bound vs compute-bound verify,
    draft forward vs verify forward) right, which is what the allocator needs.
    """
    bandwidth = gpu.memory_bandwidth * BANDWIDTH_EFFICIENCY
    flops = gpu.peak_flops * FLOPS_EFFICIENCY
    weights = target.weight_bytes / bandwidth  # s to stream the target's weights once
    per_token = 2.0 * target.matmul_params / flops  # s of GEMM work per verify token
    draft_forward = draft.layers * EAGER_SECONDS_PER_LAYER + draft.weight_bytes / bandwidth
    draft_token = 2.0 * draft.matmul_params / flops
    return CostModel(
        draft=DraftCost(
            extend_forward=draft_forward,
            decode_forward=draft_forward,
            row_step=draft_token,
            catchup_token=draft_token,
            context_row_step=draft.kv_bytes_per_token / bandwidth,
        ),
        verify=VerifyCost(
            fixed=target.layers * EAGER_SECONDS_PER_LAYER + weights,
            row=0.0,
            token=0.0,
            context_token=target.kv_bytes_per_token / bandwidth,
            knots=(weights / per_token,),
            knot_slopes=(per_token,),
        ),
        source="analytical",
    )


# The cost file -----------------------------------------------------------------


@dataclass(frozen=True)
class CostKey:
    """Which deployment a profiled model belongs to. Build it with ``CostKey.of``."""

    gpu: str
    target: str
    draft: str
    attention_backend: str
    dtype: str

    @classmethod
    def of(
        cls,
        gpu: str,
        target: str,
        draft: str,
        attention_backend: str,
        dtype: Any,
        draft_attention_backend: Optional[str] = None,
    ) -> "CostKey":
        """Normalised: models by their last path component (a local copy of
        ``org/Model`` matches ``/data/Model``), dtype without a ``torch.`` prefix, and a
        draft on a backend of its own (``--speculative-draft-attention-backend``) named
        after the target's, "flashinfer/draft:triton": its draft costs differ."""
        if draft_attention_backend not in (None, attention_backend):
            attention_backend = f"{attention_backend}/draft:{draft_attention_backend}"
        return cls(
            gpu=gpu,
            target=_model_name(target),
            draft=_model_name(draft),
            attention_backend=attention_backend,
            dtype=str(dtype).removeprefix("torch."),
        )


def read_cost_entries(path: str | os.PathLike[str]) -> tuple[dict[CostKey, CostModel], int]:
    """The file's models by key, and its format."""
    data = json.loads(Path(path).read_text())
    if data.get("format") not in range(OLDEST_FILE_FORMAT, FILE_FORMAT + 1):
        raise ValueError(
            f"cost file {path}: format {data.get('format')!r}, expected {OLDEST_FILE_FORMAT}..{FILE_FORMAT}"
        )
    entries = {CostKey(**e["key"]): CostModel.from_dict(e["model"]) for e in data["entries"]}
    return entries, int(data["format"])


def write_cost_entry(path: str | os.PathLike[str], key: CostKey, model: CostModel) -> None:
    """Add (or replace) the entry for ``key``, keeping other deployments' entries (not
    those of an older-format file: they would be stamped with this format)."""
    p = Path(path)
    entries: dict[CostKey, CostModel] = {}
    if p.is_file():
        entries, file_format = read_cost_entries(p)
        if file_format < FILE_FORMAT:
            entries = {}
    entries[key] = model
    data = {
        "format": FILE_FORMAT,
        "entries": [{"key": asdict(k), "model": m.to_dict()} for k, m in entries.items()],
    }
    p.write_text(json.dumps(data, indent=1) + "\n")


def _model_name(path: str) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]
