"""FASER_WARM_SPEC_KERNELS: SGLang's own speculative servers compile, at startup, the
Triton kernel their decode steps would otherwise compile in the middle of serving.

Every speculative decode step writes its KV slots with SGLang's
``assign_req_to_token_pool``, specialized per power-of-two batch size and per
alignment of the slot list (spec_worker/kernel_warmup.py). FASER's worker compiles
every variant at startup. An A/B that times STANDALONE or EAGLE beside FASER would
otherwise time their first-use compiles (~0.1 s each, 16 per server up to 128
requests) and not FASER's. The harness's warm-up requests do not catch them all: they
hit one alignment per batch size, by chance. Nor does Triton's disk cache carry one
server's compiles over to the next: the request rows' width is a compile-time constant
too, and SGLang widens the rows by the draft tokens a step verifies (a FASER
server that drafts ahead, by its reservation).

With the variable set (the A/B harness sets it for every server), every speculative
server that is not FASER runs the same warm-up right after its scheduler is built. The
ranges it launches are empty: nothing is written, and serving is unchanged.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV = "FASER_WARM_SPEC_KERNELS"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def warm_after_init(result, scheduler, *args, **kwargs) -> None:
    """AFTER hook on ``Scheduler.__init__``: warm a speculative server that is not
    FASER's (whose worker warms itself)."""
    # Imported here: the A/B harness reads ENV from this module without loading torch.
    from faser_sglang.plugin import FaserSpecAlgo
    from faser_sglang.spec_worker.kernel_warmup import warm_decode_allocation

    algorithm = scheduler.spec_algorithm
    if algorithm.is_none() or isinstance(algorithm, FaserSpecAlgo):
        return None
    max_batch = scheduler.max_running_requests
    launches = warm_decode_allocation(scheduler.req_to_token_pool.req_to_token, max_batch)
    logger.info(
        "FASER %s: %s server, %d launches of SGLang's speculative KV allocation kernel for "
        "decode batches up to %d%s",
        ENV,
        algorithm.name,
        launches,
        max_batch,
        "" if launches else " (none off CUDA)",
    )
    return None
