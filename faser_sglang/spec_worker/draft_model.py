"""The draft model as SGLang's scheduler expects to find it on a spec worker.

SGLang reaches through ``spec_worker.draft_worker`` for ``draft_runner`` (its KV
pool, for disaggregation and hierarchical cache), ``draft_runners`` (weight
updates) and the graph/weight-load bookkeeping. FASER's draft is a plain causal LM
run by its own ``TpModelWorker``; this wrapper gives it that shape.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from faser_sglang.spec_worker.draft_chain import DraftChains, build_draft_chains


class DraftModel:
    def __init__(self, server_args, gpu_id: int, ps, nccl_port: int, *, chains: bool, sampled_chains: bool):
        self.server_args = server_args
        self.want_chains = chains
        self.want_sampled_chains = sampled_chains
        self.chains: Optional[DraftChains] = None  # built in init_cuda_graphs
        self.worker = TpModelWorker(
            server_args=server_args,
            gpu_id=gpu_id,
            ps=replace(ps, pp_rank=0),  # speculative workers run without pipeline parallelism
            nccl_port=nccl_port,
            is_draft_worker=True,
        )

    @property
    def draft_runner(self):
        return self.worker.model_runner

    @property
    def draft_runners(self) -> list:
        return [self.worker.model_runner]

    @property
    def tokenizer(self):
        return self.worker.tokenizer

    @property
    def graph_memory_usage(self) -> dict[str, float]:
        return self.worker.graph_memory_usage

    @property
    def graph_time_usage(self) -> dict[str, float]:
        return self.worker.graph_time_usage

    @property
    def weight_load_time(self) -> float:
        return self.worker.weight_load_time

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        """Share the target's request-to-token map and slot allocator: a token's
        draft KV lives at the same slot index as its target KV, in the draft's pool."""
        self.worker.alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        # The pools above are sized as a speculative draft's (from the target's
        # memory plan). From here on FASER feeds the draft plain EXTEND / DECODE
        # forwards, so its attention backend and CUDA graphs are set up as an
        # ordinary decoder's, not as an EAGLE-style draft's.
        self.worker.model_runner.spec_algorithm = SpeculativeAlgorithm.NONE

    def init_attention_backends(self) -> None:
        self.worker.init_attention_backends()

    def init_cuda_graphs(self) -> None:
        """The draft's decode graphs (catch-up rows, steps that draft one forward at a
        time), then the chains of a step's draft forwards (draft_chain.py)."""
        self.worker.init_cuda_graphs(capture_decode_cuda_graph=True)
        self.chains = build_draft_chains(
            self.server_args,
            self.draft_runner,
            self.server_args.speculative_num_steps,
            self.want_chains,
            self.want_sampled_chains,
        )
