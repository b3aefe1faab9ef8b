"""A step's draft forwards, run as one chain.

Run one forward at a time (draft.py), every draft forward builds a ForwardBatch, plans
attention and replays the draft's decode graph: 2-4 ms of host time per forward on an
H200, more than a small draft's GPU time at small batches. A chain needs no host
decision between forwards (the next input is the argmax of the last logits, a draw
from them with a uniform drawn beforehand (chain_sampling.py), or a token known in
advance), so the forwards run as one unit, the way SGLang's EAGLE and STANDALONE
drafters run theirs: one multi-step attention backend (an attention backend per
forward, all planned before the first) and, where decode CUDA graphs run, one replay
of a graph SGLang's ``EAGLEDraftCudaGraphRunner`` captured around
``_Chain.draft_forward``. Greedy batches larger than the captured sizes, and devices
without CUDA graphs, run the same ``draft_forward`` eagerly after one multi-step plan.
There is one greedy chain per number of forwards M in 1..K_max + MAX_FORCED_GAP, and
as many sampled ones (rows that sample keep each draw's distribution q), whose graphs
are captured up to SAMPLED_GRAPH_ROWS rows: the q of every captured row and forward is
a [rows, M, V] float32 buffer. Larger sampled batches draft one forward at a time
where graphs run (``DraftChains.serves``).

A chain row r starts at position s_r, the first position its draft KV lacks, and is
fed g_r + 1 *forced* tokens known in advance (g_r <= MAX_FORCED_GAP) before its own
draws take over:
    seq_lens = positions = s_r, out_cache_loc = the KV slots of positions s_r .. s_r + M,
    forward j feeds forced[r, j] if j <= g_r, else the token forward j - 1 drew, at
    position s_r + j, attends over s_r + j + 1 tokens and predicts position s_r + j + 1.
``DraftChains.run`` returns each row's draws from g_r on: its tokens after L_r.
Two ways draft.py uses it:
  - from the committed tokens (every drafting row lags its committed length L_r by
    g_r <= MAX_FORCED_GAP tokens): s_r = L_r - g_r, forced = the g_r committed tokens
    and the bonus token, M = max g + m; row r's drafts d1..d_m are the draws of
    forwards g_r .. g_r + m - 1. The catch-up is the chain's first forwards: no forward of its own.
  - after a catch-up forward that gave d1: s_r = L_r + 1, forced = d1, M = m - 1.

Every row runs all M forwards. A row that drafts less than m, or lags less than the
most lagging row, drafts past its length: those tokens are dropped, and the draft KV
it wrote past position L_r + m - 1 is never counted valid (state.py). The writes reach
at most position L_r + MAX_FORCED_GAP + K_max - 1, no further than the step's verify
writes (L_r + K_max): under the overlap schedule that is all SGLang's per-step
reservation guarantees (it reserves 2 * (K_max + 1) slots past a committed length that
may lag L_r by K_max + 1), so MAX_FORCED_GAP cannot grow past 1 without reserving more.

The chains attend through one multi-step attention backend, the longest chain's, of
which the shorter ones use the first steps; on FlashInfer it plans from host lengths
(chain_backends.py).
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.utils import get_cuda_graph_max_batch_size

from faser_sglang.kv_reserve import MAX_FORCED_GAP
from faser_sglang.spec_worker.chain_backends import ChainBackends
from faser_sglang.spec_worker.chain_sampling import ChainSampling
from faser_sglang.spec_worker.sampling import SamplingRows
from faser_sglang.tensors import aligned, device_tensor

logger = logging.getLogger(__name__)


# Rows up to which sampled chains are captured as CUDA graphs; larger sampled batches
# draft one forward at a time (DraftChains.serves). Their q buffer is [rows, K_max + 1,
# V] float32 (297 MiB at 64 rows, K_max = 7 and a 152k vocabulary; the logit bias 37 MiB
# more), and at large batches a step's GPU time, not its host time, dominates.
SAMPLED_GRAPH_ROWS = 64


class _Chain:
    """M forwards of the draft, in the shape of the drafter
    ``EAGLEDraftCudaGraphRunner`` captures: it reads ``draft_runner``,
    ``speculative_num_steps`` (M + 1: the runner's S steps are S - 1 forwards) and the
    DSA fields, calls ``draft_forward`` once per captured batch size, and subtracts M
    from the positions afterwards (``draft_forward`` adds one per forward). The forced
    tokens and gaps come from the chains' shared device buffers, which a graph reads
    at its captured addresses; so does the sampling state of a sampled chain (None:
    every row takes the argmax)."""

    dsa_index_topk = None
    seed_dsa_topk_from_draft_extend = False

    def __init__(
        self,
        draft_runner,
        attn_backend,
        forwards: int,
        forced: torch.Tensor,
        gaps: torch.Tensor,
        sampling: Optional[ChainSampling] = None,
    ):
        self.draft_runner = draft_runner
        self.draft_attn_backend = attn_backend
        self.forwards = forwards
        self.speculative_num_steps = forwards + 1
        self.forced = forced  # [rows, MAX_FORCED_GAP + 1] int64
        self.gaps = gaps  # [rows] int64
        self.sampling = sampling

    def draft_forward(self, fb: ForwardBatch):
        bs = fb.batch_size
        forced, gaps = self.forced[:bs], self.gaps[:bs]  # [bs, G + 1], [bs]
        locs = fb.out_cache_loc.view(bs, self.speculative_num_steps)  # [bs, M + 1]
        fb.capture_hidden_mode = CaptureHiddenMode.NULL
        token = forced[:, 0]
        out = []
        for step in range(self.forwards):
            fb.input_ids = token
            fb.out_cache_loc = locs[:, step].contiguous()
            with forward_context(ForwardContext(attn_backend=self.draft_attn_backend.attn_backends[step])):
                logits = self.draft_runner.forward(fb).logits_output.next_token_logits  # [bs, V]
            token = torch.argmax(logits, dim=-1) if self.sampling is None else self.sampling.draw(logits, step)
            out.append(token)
            fb.positions.add_(1)
            if step + 1 < forced.shape[1]:  # rows still fed their known tokens
                token = torch.where(gaps > step, forced[:, step + 1], token)
        # The graph runner's output convention: (parents, scores, tokens, draft probs).
        # A sampled chain's q stay in its sampling state, at an address no graph reuses.
        return None, None, torch.stack(out, dim=1), None


class DraftChains:
    """The chains of 1..K_max + MAX_FORCED_GAP forwards, greedy and, when ``sampled``,
    sampled, captured as CUDA graphs when ``graphs``."""

    def __init__(self, server_args, draft_runner, k_max: int, graphs: bool, sampled: bool):
        self.draft_runner = draft_runner
        self.req_to_token = draft_runner.req_to_token_pool.req_to_token  # [max_reqs, max_context] int32
        self.vocab = draft_runner.model_config.vocab_size
        # Every running request has a pool row; graphs are captured up to the size
        # SGLang's multi-step backends size their buffers for.
        rows = get_cuda_graph_max_batch_size(server_args, draft_runner.req_to_token_pool.size)
        self.forced = torch.zeros((rows, MAX_FORCED_GAP + 1), dtype=torch.int64, device=draft_runner.device)
        self.gaps = torch.zeros(rows, dtype=torch.int64, device=draft_runner.device)
        longest = k_max + MAX_FORCED_GAP
        self.backends = ChainBackends(server_args, draft_runner, longest)
        self.chains = {
            m: _Chain(draft_runner, self.backends.backend(m), m, self.forced, self.gaps) for m in range(1, longest + 1)
        }
        self.graphs = graphs
        self.runners = self._capture(self.chains) if graphs else {}
        self.graph_rows = min((r.max_captured for r in self.runners.values()), default=0)
        # The sampled chains' graphs and the sampling state they read (module docstring).
        # A second capture needs the shared backend: one of a chain's own would set its
        # graph state up again, under the greedy chain's graphs.
        self.sampled, self.sampled_off = sampled, None
        sampled_rows = (
            max((bs for bs in _graph_batch_sizes(draft_runner) if bs <= SAMPLED_GRAPH_ROWS), default=0) if graphs else 0
        )
        if sampled and graphs and not self.backends.shared:
            self.sampled, self.sampled_off = False, "the attention backend's chains do not share one backend"
        elif sampled and graphs and not sampled_rows:
            self.sampled, self.sampled_off = False, f"no decode graph batch size is <= {SAMPLED_GRAPH_ROWS}"
        self.sampling: Optional[ChainSampling] = None
        self.sampled_runners: dict = {}
        if graphs and self.sampled:
            self.sampling = ChainSampling(sampled_rows, longest, self.vocab, draft_runner.device)
            sampled_chains = {m: copy.copy(chain) for m, chain in self.chains.items()}
            for chain in sampled_chains.values():
                chain.sampling = self.sampling
            self.sampled_runners = self._capture(sampled_chains, up_to=sampled_rows)
        self.sampled_graph_rows = min((r.max_captured for r in self.sampled_runners.values()), default=0)

    def _capture(self, chains: dict, up_to: Optional[int] = None) -> dict:
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

        class Graphs(EAGLEDraftCudaGraphRunner):
            """SGLang's draft graph runner, capturing batch sizes up to ``up_to`` only;
            its buffers and attention graph state keep their full size, which every
            chain's graphs share (chain_backends.py)."""

            def capture(self) -> None:
                if up_to is not None:
                    self.capture_bs = [bs for bs in self.capture_bs if bs <= up_to]
                self.max_captured = max(self.capture_bs)
                super().capture()

        with _without_decode_graphs(self.draft_runner):
            return {
                m: Graphs(chain, draft_attn_backend=chain.draft_attn_backend, speculative_num_steps=chain.speculative_num_steps)
                for m, chain in chains.items()
            }

    def serves(self, rows: int, greedy: bool) -> bool:
        """Whether a chain drafts for this many rows: greedy unbiased ones always;
        sampling or biased ones (``greedy`` False) where sampled chains are built and,
        with graphs, fit the sampled graphs. A larger such batch drafts one forward at a
        time, replaying the draft's decode graphs, rather than running a chain's forwards
        eagerly with a [rows, M, V] q of its own."""
        return greedy or (self.sampled and (not self.graphs or rows <= self.sampled_graph_rows))

    def graphed(self, rows: int, sampled: bool = False) -> bool:
        """Whether a chain over this many rows replays a CUDA graph."""
        return rows <= (self.sampled_graph_rows if sampled else self.graph_rows)

    def run(
        self,
        pool_rows: Sequence[int],  # [n] the drafting rows' request-pool rows
        starts: Sequence[int],  # [n] s_r, the first position each row feeds
        gaps: Sequence[int],  # [n] g_r in 0..MAX_FORCED_GAP
        forced: torch.Tensor,  # [n, max(gaps) + 1] int64, row r's first g_r + 1 inputs
        forwards: int,  # M
        drafts: int,  # tokens wanted per row, drafts + max(gaps) <= M
        sampling: Optional[SamplingRows] = None,  # [n] the rows' sampling; None: greedy, unbiased
        generator: Optional[torch.Generator] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """[n, drafts] int64: each row's draws g_r .. g_r + drafts - 1 (forward j's draw
        is the token at position s_r + j + 1, so these follow position L_r); when some
        row of ``sampling`` samples, also [n, drafts, V] float32, the distribution q of
        each (a greedy row's q is unused by the verify), else None."""
        n = len(starts)
        device = forced.device
        fed_cpu = torch.tensor(list(starts), dtype=torch.int64)  # [n]
        gaps_fed_rows = device_tensor([*gaps, *starts, *pool_rows], device).view(3, n)  # one copy
        return self._draft(
            gaps_fed_rows[2], gaps_fed_rows[1], gaps_fed_rows[0], forced, forwards, drafts,
            fed_cpu, int(fed_cpu.sum()), sampling, generator,
        )  # fmt: skip

    def plans_on_device(self, rows: int, sampled: bool = False) -> bool:
        """Whether a chain over this many rows (``sampled``: through the sampled chains)
        runs without host lengths (``run_ahead``): its graph replays through a multi-step
        backend that plans with kernels (Triton's), or it runs on the CPU, where the
        device's lengths are the host's. FlashInfer plans from host lengths
        (chain_backends.py)."""
        if self.draft_runner.device == "cpu":
            return True
        return self.graphed(rows, sampled) and self.backends.plans_on_device

    def run_ahead(
        self,
        pool_rows: torch.Tensor,  # [n] int64 the drafting rows' request-pool rows
        starts: torch.Tensor,  # [n] int64 s_r, on the device only
        gaps: torch.Tensor,  # [n] int64 g_r in 0..MAX_FORCED_GAP, on the device only
        forced: torch.Tensor,  # [n, G + 1] int64, row r's first g_r + 1 inputs, G >= max g_r
        forwards: int,  # M
        drafts: int,  # tokens wanted per row, drafts + G <= M
        sampling: Optional[SamplingRows] = None,  # [n] the rows' sampling; None: greedy, unbiased
        generator: Optional[torch.Generator] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``run`` for a chain whose starts and gaps the host does not know
        (draft_ahead.py): the same outputs. Only where ``plans_on_device``."""
        on_cpu = starts.device.type == "cpu"
        fed_cpu = starts.clone() if on_cpu else None  # a CPU tensor is its own host copy
        return self._draft(
            pool_rows, starts, gaps, forced, forwards, drafts,
            fed_cpu, int(starts.sum()) if on_cpu else None, sampling, generator,
        )  # fmt: skip

    def _draft(
        self,
        req_pool_indices: torch.Tensor,  # [n] int64
        fed: torch.Tensor,  # [n] int64 s_r
        gaps: torch.Tensor,  # [n] int64 g_r
        forced: torch.Tensor,  # [n, G + 1] int64
        forwards: int,
        drafts: int,
        fed_cpu: Optional[torch.Tensor],  # [n] s_r on the host; None: planned on the device
        seq_lens_sum: Optional[int],  # None with fed_cpu: a multi-step backend bounds it
        sampling: Optional[SamplingRows],
        generator: Optional[torch.Generator],
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        n = fed.numel()
        device = forced.device
        # Rows of a packed copy (run, draft_ahead.py): aligned so that the backend's
        # Triton index kernel replays the variants compiled at graph capture.
        req_pool_indices, fed = aligned(req_pool_indices), aligned(fed)
        self.forced[:n, : forced.shape[1]].copy_(forced)
        self.gaps[:n].copy_(gaps)
        positions = fed.unsqueeze(1) + torch.arange(forwards + 1, device=device)  # [n, M + 1]
        locs = self.req_to_token[req_pool_indices.unsqueeze(1), positions].to(torch.int64)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=n,
            input_ids=None,
            req_pool_indices=req_pool_indices,
            seq_lens=fed,
            seq_lens_cpu=fed_cpu,
            out_cache_loc=locs.reshape(-1),
            seq_lens_sum=seq_lens_sum,
            positions=fed.clone(),
            spec_algorithm=self.draft_runner.spec_algorithm,
            spec_info=EagleDraftInput(  # read by the graph runner only; the inputs are ``forced``
                topk_p=torch.ones((n, 1), dtype=torch.float32, device=device),
                topk_index=forced[:, :1],
                capture_hidden_mode=CaptureHiddenMode.NULL,
            ),
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        sampled = sampling is not None
        graphed = self.graphed(n, sampled)
        state = None
        if sampled:
            state = self.sampling if graphed else ChainSampling(n, forwards, self.vocab, device)
            state.load(sampling, generator)
        if graphed:
            runners = self.sampled_runners if sampled else self.runners
            _, _, tokens, _ = runners[forwards].execute(fb)
        else:
            chain = copy.copy(self.chains[forwards])
            chain.sampling = state
            chain.draft_attn_backend.init_forward_metadata(fb)
            fb.mark_forward_metadata_ready()
            with _without_decode_graphs(self.draft_runner):
                _, _, tokens, _ = chain.draft_forward(fb)
        first = self.gaps[:n].unsqueeze(1) + torch.arange(drafts, device=device)  # [n, drafts]
        probs = None
        if sampled and not sampling.all_greedy:  # state.probs: [rows, M_longest or M, V]
            probs = state.probs[:n].gather(1, first.unsqueeze(2).expand(n, drafts, self.vocab))
        return tokens.gather(1, first), probs  # tokens: [n, M]


def _graph_batch_sizes(draft_runner) -> list[int]:
    """The batch sizes SGLang's draft graph runner captures for this runner."""
    from sglang.srt.model_executor.runner import get_batch_sizes_to_capture

    return get_batch_sizes_to_capture(draft_runner)[0]


@contextmanager
def _without_decode_graphs(runner) -> Iterator[None]:
    """The chain's forwards run eagerly, under the multi-step plan: with the draft's own
    decode graphs in place, a forward would replay one of them instead (nested in the
    chain's capture, or planned from the chain's first-step lengths)."""
    decode_graphs, runner.decode_cuda_graph_runner = runner.decode_cuda_graph_runner, None
    try:
        yield
    finally:
        runner.decode_cuda_graph_runner = decode_graphs


def build_draft_chains(
    server_args, draft_runner, k_max: int, enabled: bool, sampled: bool
) -> Optional[DraftChains]:
    """The chains (sampled ones too when ``sampled``), or None (logged) where steps
    draft one forward at a time: the FASER config turned them off, K_max < 2, or SGLang
    has no multi-step draft backend for the attention backend. Captured as CUDA graphs
    unless the device or the decode CUDA graph settings rule graphs out."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    if not enabled or k_max < 2:
        reason = "draft_chain is false in the FASER config" if not enabled else "K_max < 2"
        logger.info("FASER draft steps: one forward per step (%s)", reason)
        return None
    graphs = (
        server_args.device == "cuda"
        and not server_args.disable_cuda_graph
        and not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    )
    started, free = time.perf_counter(), _free_device_memory(server_args.device)
    try:
        chains = DraftChains(server_args, draft_runner, k_max, graphs, sampled)
    except ValueError as e:  # SGLang names an attention backend it has no draft backend for
        logger.info("FASER draft steps: one forward per step (%s)", e)
        return None
    except torch.cuda.OutOfMemoryError as e:
        raise RuntimeError(out_of_memory_message(server_args, sampled)) from e
    taken = "" if free is None else f", {(free - _free_device_memory(server_args.device)) / 2**30:.2f} GiB"
    if not graphs:
        replays = "eager (no decode CUDA graphs)"
    elif chains.sampled:
        replays = f"CUDA graphs up to {chains.graph_rows} rows, sampled up to {chains.sampled_graph_rows}"
    else:
        replays = f"CUDA graphs up to {chains.graph_rows} rows"
    if chains.sampled_off is not None:
        logger.info("FASER draft steps: sampled steps draft one forward at a time (%s)", chains.sampled_off)
    logger.info(
        "FASER draft steps: %s chains of 1..%d forwards, %s, %s (set up in %.1f s%s)",
        "greedy and sampled" if chains.sampled else "greedy",
        k_max + MAX_FORCED_GAP,
        replays,
        "one attention backend for all" if chains.backends.shared else "an attention backend each",
        time.perf_counter() - started,
        taken,
    )
    return chains


def out_of_memory_message(server_args, sampled: bool) -> str:
    """What to change when capturing the chains ran out of device memory: they are
    allocated after SGLang's KV pool, in the memory it leaves for activations and graphs."""
    lighter = '"sampled_chain": false or "draft_chain": false' if sampled else '"draft_chain": false'
    return (
        "FASER ran out of GPU memory capturing the draft chains' CUDA graphs, which are allocated after "
        "SGLang's KV pool, outside its memory plan. Leave them more room: lower --mem-fraction-static "
        f"(now {server_args.mem_fraction_static}) or --cuda-graph-max-bs-decode "
        f"(now {server_args.cuda_graph_config.decode.max_bs}), "
        f"or set {lighter} in the FASER config."
    )


def _free_device_memory(device: str) -> Optional[int]:
    """Free bytes on the current CUDA device; None on other devices."""
    return torch.cuda.mem_get_info()[0] if device == "cuda" else None
