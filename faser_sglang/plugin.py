"""SGLang plugin entry: registers the FASER speculative algorithm.

SGLang runs every ``sglang.srt.plugins`` entry point once per process
(launcher, engine, each scheduler) before it parses arguments, so
``--speculative-algorithm FASER`` resolves everywhere through SGLang's own
registry. Hooks, through SGLang's HookRegistry: the target model captures its decode
CUDA graphs as a plain decoder's instead of for EAGLE-style verification, its KV
memory plan counts the draft's KV pool too (``faser_sglang.memory_plan``), a server
that drafts ahead reserves the KV its chains write
(``faser_sglang.kv_reserve``), and
requests are checked before they reach the scheduler (``faser_sglang.request_guard``),
and every speculative server records its KV allocation before a decode step from host
lists instead of per-request tensor reads (``faser_sglang.spec_alloc``);
with ``FASER_SCHED_TIMELINE`` set, the scheduler loop's host timeline is recorded, in
any server (``faser_sglang.sched_timeline``); with ``FASER_WARM_SPEC_KERNELS`` set,
SGLang's own speculative servers compile their KV allocation kernel at startup, as
FASER's does (``faser_sglang.baseline_warmup``); with ``FASER_HOST_PREFILL_PLAN`` set,
any server plans its prefills' FlashInfer attention from host-known lengths, without
waiting for the GPU (``faser_sglang.host_plan``).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from faser_sglang import baseline_warmup, host_plan, kv_reserve, memory_plan, request_guard, sched_timeline, spec_alloc
from faser_sglang.spec_worker import validation

ALGORITHM_NAME = "FASER"


class FaserSpecAlgo(CustomSpecAlgo):
    """FASER as SGLang sees it: a chain drafter with its own draft KV cache.

    SGLang 0.5.17's scheduler calls ``need_topk``, ``carries_draft_hidden_states``
    and ``create_future_map`` on the algorithm object, which ``CustomSpecAlgo``
    does not define; FASER answers them like a non-EAGLE chain drafter. It runs on
    SGLang's V2 schema with or without overlap scheduling (worker.py).
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

        # FASER's policy and batch views read every step's committed lengths on the host,
        # so the overlap schedule must resolve them there whatever the attention backend.
        return FutureMap(device, self, req_to_token_pool, True, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        validation.handle_server_args(server_args)


def _worker_factory(server_args):
    from faser_sglang.spec_worker.worker import FaserWorker

    return FaserWorker


CAPTURE_CUDA_GRAPHS = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_cuda_graphs"


def _target_graphs_as_plain_decoder(original, *args, **kwargs):
    """SGLang captures a speculative target's decode graphs in TARGET_VERIFY mode, with
    a fixed verify width and EAGLE inputs. FASER's target runs plain DECODE forwards
    (its verify as decode rows, chunk_forward.py), so its decode graphs are captured
    as an ordinary decoder's: the runner's algorithm reads NONE during the capture."""
    runner = kwargs.get("model_runner")
    if not isinstance(runner.spec_algorithm, FaserSpecAlgo) or runner.is_draft_worker:
        return original(*args, **kwargs)
    algorithm = runner.spec_algorithm
    runner.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        return original(*args, **kwargs)
    finally:
        runner.spec_algorithm = algorithm


def register() -> None:
    """Entry point (group ``sglang.srt.plugins``); safe to call more than once."""
    if _registered():
        return
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=validation.validate_server_args,
        spec_class=FaserSpecAlgo,
    )(_worker_factory)
    HookRegistry.register(CAPTURE_CUDA_GRAPHS, _target_graphs_as_plain_decoder, HookType.AROUND)
    HookRegistry.register(memory_plan.CREATE_CONFIGURATOR, memory_plan.count_draft_kv, HookType.AROUND)
    HookRegistry.register(kv_reserve.ALLOC_RESERVE, kv_reserve.reserve_per_decode, HookType.AROUND)
    HookRegistry.register(kv_reserve.EXTRA_CONTEXT, kv_reserve.extra_context_len, HookType.AROUND)
    HookRegistry.register(request_guard.TOKENIZE_STEP, request_guard.guard_tokenize, HookType.AROUND)
    HookRegistry.register(request_guard.VALIDATE_STEP, request_guard.guard_validate, HookType.AROUND)
    HookRegistry.register(spec_alloc.ALLOC_FOR_SPEC_DECODE, spec_alloc.lengths_as_list, HookType.AROUND)
    if sched_timeline.timeline_dir() is not None:
        for target, hook in sched_timeline.hooks():
            HookRegistry.register(target, hook, HookType.AROUND)
    if baseline_warmup.enabled():
        HookRegistry.register(baseline_warmup.SCHEDULER_INIT, baseline_warmup.warm_after_init, HookType.AFTER)
    if host_plan.enabled():
        HookRegistry.register(host_plan.UPDATE_SINGLE_WRAPPER, host_plan.plan_from_host, HookType.AROUND)


def _registered() -> bool:
    from sglang.srt.speculative.spec_registry import get_spec

    return get_spec(ALGORITHM_NAME) is not None
