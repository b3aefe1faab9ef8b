"""Closed-loop throughput of several contenders on one target, side by side.

    python -m faser_sglang.bench.quick --target T --draft D --concurrency 1 16 64 \
        --contenders no-spec standalone-k3 faser --out results.json

Each contender is launched in turn on the same GPU, warmed up, then sent the same
prompts with a fixed number of requests in flight; it reports output tokens/s,
mean accepted length and every greedy output, so the run also checks that all
contenders produced identical tokens (FASER is lossless). The full A/B benchmark
with traces and latency percentiles is ``faser_sglang.bench.ab``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from faser_sglang.bench import servers
from faser_sglang.bench.client import replay


@dataclass(frozen=True)
class Prompt:
    prompt: str
    max_new_tokens: int


def run(args: argparse.Namespace) -> dict:
    prompts = _prompts(args.prompts, args.num_prompts, args.max_new_tokens)
    greedy = {"temperature": 0, "ignore_eos": True}
    rows = []
    outputs: dict[str, dict[int, list[list[int]]]] = {}
    for name in args.contenders:
        c = servers.contender(name, args.draft, args.k_max)
        t0 = time.monotonic()
        server_args = (*args.server_args, *c.args)
        with servers.launch(args.target, server_args, env=c.env, timeout=900, log_dir=args.log_dir) as server:
            startup = time.monotonic() - t0
            warm = prompts[:4]
            replay(server.base_url, warm, [0.0] * len(warm), greedy)  # warm-up
            for conc in args.concurrency:
                res = replay(server.base_url, prompts, [0.0] * len(prompts), greedy, max_workers=conc)
                errors = [t.error for t in res.timings if t.error]
                if errors:
                    raise RuntimeError(f"{name}: {len(errors)} failed requests, e.g. {errors[0]}")
                tokens = sum(t.output_tokens for t in res.timings)
                accept = [t.meta.get("spec_accept_length") for t in res.timings]
                accept = [a for a in accept if a]
                rows.append(
                    {
                        "contender": name,
                        "concurrency": conc,
                        "output_tokens": tokens,
                        "seconds": round(res.duration, 3),
                        "tokens_per_s": round(tokens / res.duration, 1),
                        "mean_accept_length": round(sum(accept) / len(accept), 3) if accept else None,
                        "startup_s": round(startup, 1),
                    }
                )
                outputs.setdefault(name, {})[conc] = [t.output_ids for t in res.timings]
                print(json.dumps(rows[-1]), flush=True)
    base = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["contender"] == args.contenders[0]}
    for r in rows:
        r[f"vs_{args.contenders[0]}"] = round(r["tokens_per_s"] / base[r["concurrency"]], 3)
    ref = outputs[args.contenders[0]]
    mismatches = {
        name: {c: sum(a != b for a, b in zip(ref[c], outs[c])) for c in outs}
        for name, outs in outputs.items()
    }
    return {"rows": rows, "greedy_mismatches_vs_first": mismatches}


def _prompts(source: str, n: int, max_new_tokens: int) -> list[Prompt]:
    if source == "humaneval":
        from faser_sglang.bench.workloads import humaneval

        return [Prompt(r.prompt, max_new_tokens) for r in humaneval(n)]
    base = [
        "def quicksort(items):",
        "Write a Python function that parses a CSV file and",
        "class LRUCache:\n    def __init__(self, capacity):",
        "import json\n\ndef load_config(path):",
    ]
    return [Prompt(base[i % len(base)] + f"  # {i}", max_new_tokens) for i in range(n)]


def markdown(result: dict, baseline: str) -> str:
    lines = [
        f"| contender | concurrency | tokens/s | vs {baseline} | mean accept length |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        acc = "" if r["mean_accept_length"] is None else f"{r['mean_accept_length']:.2f}"
        lines.append(
            f"| {r['contender']} | {r['concurrency']} | {r['tokens_per_s']:.0f} | "
            f"{r[f'vs_{baseline}']:.2f}x | {acc} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--k-max", type=int, default=5)
    p.add_argument("--contenders", nargs="+", default=["no-spec", "standalone-k3", "faser"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 64])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", choices=["builtin", "humaneval"], default="builtin")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="passed to every server")
    p.add_argument("--out", type=Path)
    p.add_argument("--log-dir", type=Path, help="keep every server's log here (sglang-<port>-*.log)")
    args = p.parse_args(argv)
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    result = run(args)
    table = markdown(result, args.contenders[0])
    print(table)
    print("greedy mismatches vs first contender:", json.dumps(result["greedy_mismatches_vs_first"]))
    if args.out:
        args.out.write_text(json.dumps({**result, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
