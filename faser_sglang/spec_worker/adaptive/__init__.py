"""FASER's Adaptive Drafter: per-request draft lengths from a profiled step-cost model
and sliding-window acceptance estimates, chosen to maximise the batch's tokens/s.

    acceptance.py  per-request, per-position acceptance windows with a pooled prior
    cost_model.py  step time = draft time + verify time (profiled fit or roofline)
    hardware.py    GPU datasheet numbers and model sizes for the roofline fallback
    allocator.py   greedy marginal-gain choice of every k_i for one step
    calibration.py what a drafting step costs in the scheduler loop beyond the cost model
    drafter.py     AdaptiveDrafterPolicy (policy "adaptive") and its cost-model loading
"""

from faser_sglang.spec_worker.adaptive.acceptance import AcceptanceWindows
from faser_sglang.spec_worker.adaptive.allocator import Allocation, CatchupPieces, allocate
from faser_sglang.spec_worker.adaptive.calibration import DraftingOverhead
from faser_sglang.spec_worker.adaptive.cost_model import (
    CostKey,
    CostModel,
    DraftCost,
    PlainCost,
    StepSample,
    VerifyCost,
    analytical,
    fit,
    read_cost_entries,
    sample_time,
    write_cost_entry,
)
from faser_sglang.spec_worker.adaptive.drafter import (
    AdaptiveDrafterPolicy,
    Deployment,
    charged_catchup,
    deployment_from_runners,
    load_cost_model,
)
from faser_sglang.spec_worker.adaptive.hardware import GpuSpec, ModelShape, gpu_spec

__all__ = [
    "AcceptanceWindows",
    "AdaptiveDrafterPolicy",
    "Allocation",
    "CatchupPieces",
    "CostKey",
    "CostModel",
    "Deployment",
    "DraftingOverhead",
    "DraftCost",
    "GpuSpec",
    "ModelShape",
    "PlainCost",
    "StepSample",
    "VerifyCost",
    "allocate",
    "analytical",
    "charged_catchup",
    "deployment_from_runners",
    "fit",
    "gpu_spec",
    "load_cost_model",
    "read_cost_entries",
    "sample_time",
    "write_cost_entry",
]
