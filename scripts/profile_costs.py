"""Profile FASER's decode-step cost on this GPU and fit the adaptive drafter's cost model.

    python scripts/profile_costs.py --target TARGET --draft DRAFT --out costs.json \\
        [--k-max 8] [--batch-sizes 1,2,4,...,256] [--long-batch-sizes 1,4,16,32] \\
        [--attention-backend flashinfer] [--dtype bfloat16] [--draft-prefill eager|lazy] \\
        [--temperature 0.8] [--server-args "..."]

Timings come from the real server, not from standalone forwards: one FASER server
runs policy "random" (every step draws fresh per-request lengths in [0, K_max]) with
a per-step trace. For each batch size bs it is sent bs requests at once that decode
--max-new-tokens tokens with ignore_eos, so the running batch stays at bs; HumanEval
prompts give short contexts, the "long" workload 2k-8k-token ones. Every traced
decode step is one sample (step seconds, lengths, context lengths, draft KV fill,
and draft-phase seconds when the worker records them; steps whose cap is 0 are plain
decodes, which get their own term); with --draft-prefill lazy each request's first
catch-up feeds its whole prompt (in decode-row pieces, or one EXTEND forward beyond
them), the cost a lazily prefilled request pays when it first drafts; with
--temperature the requests sample (top-p 0.95), so a step's draft forwards include the
sampling transform a sampled chain runs at each forward (profile with the traffic the
server will serve: the entry's key does not say which). The cost model is fitted on
80% of them, its MAPE on the other 20% is printed and stored with it, and the entry
is written to --out under this GPU/target/draft/attention-backend/dtype key (other
entries of the file are kept). Point FASER_CONFIG's ``cost_model_path`` at the file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
from dataclasses import replace
from itertools import cycle, islice
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from faser_sglang.bench import servers, workloads
from faser_sglang.bench.ab import sampling_params
from faser_sglang.bench.client import replay
from faser_sglang.bench.servers import launch
from faser_sglang.spec_worker.adaptive import CostKey, CostModel, StepSample, fit, write_cost_entry

TOP_P = 0.95  # of sampled requests
WARMUP_BATCH = 4  # first replay compiles kernels and fills caches; its steps are dropped


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model path (as served)")
    p.add_argument("--draft", required=True, help="draft model path")
    p.add_argument("--out", required=True, help="cost JSON file to create or add this entry to")
    p.add_argument("--k-max", type=int, default=8, help="K_max the server runs with (lengths drawn in [0, K_max])")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256", help="HumanEval batch sizes")
    p.add_argument("--long-batch-sizes", default="1,4,16,32", help="long-context batch sizes ('' for none)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--attention-backend", default="flashinfer")
    p.add_argument("--draft-attention-backend", default=None, help="the draft's own backend, if not the target's")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--gpu-name", default=None, help="key's GPU name (default: torch.cuda.get_device_name(0))")
    p.add_argument("--server-args", default="", help="extra sglang.launch_server flags, one string")
    p.add_argument("--holdout", type=float, default=0.2, help="fraction of steps kept out of the fit for MAPE")
    p.add_argument(
        "--draft-prefill",
        choices=("eager", "lazy"),
        default="eager",
        help="when the draft reads a prompt; lazy: a request's first catch-up is its whole prompt "
        "(times the long catch-ups a lazily prefilled request pays)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: the requests sample (top-p 0.95)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="where the trace and server config go (default: a temp dir)")
    p.add_argument("--launch-timeout", type=float, default=1200.0)
    args = p.parse_args(argv)
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    return args


def sweep_plan(batch_sizes: str, long_batch_sizes: str) -> list[tuple[str, int]]:
    """(workload, batch size) pairs, in the order they run."""
    plan = [("humaneval", int(b)) for b in batch_sizes.split(",") if b.strip()]
    return plan + [("long", int(b)) for b in long_batch_sizes.split(",") if b.strip()]


def batch_requests(workload: str, batch_size: int, max_new_tokens: int, seed: int) -> list[workloads.Request]:
    """``batch_size`` requests of a workload (prompts repeat when it has fewer)."""
    base = workloads.humaneval() if workload == "humaneval" else workloads.load(workload, batch_size, seed)
    return [replace(r, max_new_tokens=max_new_tokens) for r in islice(cycle(base), batch_size)]


def run_batch(base_url: str, requests: Sequence[workloads.Request], sampling: dict) -> None:
    result = replay(base_url, requests, [0.0] * len(requests), sampling)
    errors = [t.error for t in result.timings if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(requests)} profiling requests failed: {errors[0]}")


def default_gpu_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on the GPU the cost model is for, or pass --gpu-name")
    return torch.cuda.get_device_name(0)


def main(argv: Sequence[str] | None = None) -> CostModel:
    args = parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="faser-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "trace.jsonl"
    trace.unlink(missing_ok=True)  # the worker appends
    config = work / "faser.json"
    config.write_text(
        json.dumps(
            {"policy": "random", "trace_path": str(trace), "seed": args.seed, "draft_prefill": args.draft_prefill}
        )
    )
    plan = sweep_plan(args.batch_sizes, args.long_batch_sizes)
    contender = servers.faser(args.draft, args.k_max, str(config))
    server_flags = [
        *contender.args,
        "--attention-backend", args.attention_backend,
        *(("--speculative-draft-attention-backend", args.draft_attention_backend) if args.draft_attention_backend else ()),
        "--dtype", args.dtype,
        "--max-running-requests", str(max(bs for _, bs in plan)),
        *shlex.split(args.server_args),
    ]  # fmt: skip
    gpu = args.gpu_name or default_gpu_name()
    sampling = sampling_params(args.temperature, TOP_P)

    launched = launch(args.target, server_flags, env=contender.env, timeout=args.launch_timeout, log_dir=work)
    with launched as server:
        run_batch(server.base_url, batch_requests("humaneval", WARMUP_BATCH, args.max_new_tokens, args.seed), sampling)
        warmup_steps = len(_trace_lines(trace))
        for workload, bs in tqdm(plan, desc="profiling", unit="batch"):
            run_batch(server.base_url, batch_requests(workload, bs, args.max_new_tokens, args.seed), sampling)

    samples = [StepSample.from_trace_record(json.loads(line)) for line in _trace_lines(trace)[warmup_steps:]]
    model = fit(samples, holdout_fraction=args.holdout, seed=args.seed)
    key = CostKey.of(gpu, args.target, args.draft, args.attention_backend, args.dtype, args.draft_attention_backend)
    write_cost_entry(args.out, key, model)
    phased = all(s.draft_seconds is not None for s in samples if any(s.draft_lens))
    phases = "draft and verify fitted apart" if phased else "joint fit: trace has no draft_seconds"
    plain = sum(not any(s.draft_lens) for s in samples)
    plain_term = "its own term" if model.plain is not None else "priced as verifies (too few for a term)"
    print(
        f"{len(samples)} decode steps ({phases}; {plain} without drafts: {plain_term}); "
        f"held-out MAPE {model.holdout_mape:.1%}\n"
        f"wrote {key} to {args.out}"
    )
    return model


def _trace_lines(trace: Path) -> list[str]:
    if not trace.is_file():
        return []
    return [line for line in trace.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
