"""SGLang plugin entry: registers the FASER speculative algorithm.

SGLang runs every ``sglang.srt.plugins`` entry point once per process
(launcher, engine, each scheduler) before it parses arguments, so
``--speculative-algorithm FASER`` resolves everywhere through SGLang's own
registry. Nothing in SGLang is patched.
"""

from __future__ import annotations

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from faser_sglang.spec_worker import validation

ALGORITHM_NAME = "FASER"


class FaserSpecAlgo(CustomSpecAlgo):
    """FASER as SGLang sees it: a chain drafter with its own draft KV cache.

    SGLang 0.5.17's scheduler calls ``need_topk``, ``carries_draft_hidden_states``
    and ``create_future_map`` on the algorithm object, which ``CustomSpecAlgo``
    does not define; FASER answers them like a non-EAGLE chain drafter.
    """

    def need_topk(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def create_future_map(
        self,
        device,
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        validation.handle_server_args(server_args)


def _worker_factory(server_args):
    from faser_sglang.spec_worker.worker import FaserWorker

    return FaserWorker


def register() -> None:
    """Entry point (group ``sglang.srt.plugins``); safe to call more than once."""
    if _registered():
        return
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=False,
        validate_server_args=validation.validate_server_args,
        spec_class=FaserSpecAlgo,
    )(_worker_factory)


def _registered() -> bool:
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec(ALGORITHM_NAME) is not None
