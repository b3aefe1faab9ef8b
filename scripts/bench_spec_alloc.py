"""Host time of SGLang's speculative KV allocation before a decode step, as SGLang runs it
and with the plugin's host-list hook (faser_sglang/spec_alloc.py), side by side.

    .venv/bin/python scripts/bench_spec_alloc.py [--batch-sizes 8 64 128 256] [--rounds 300]

Runs ``alloc_for_spec_decode`` on the CPU test's stand-ins (tests/test_spec_alloc.py: a
page-size-1 allocator, a chunk cache, request rows on the host), with the Triton slot
write left out (both sides launch it alike), and prints the median per batch size and
the ratio. The batch pick of a decode step pays this once per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_spec_alloc import _step, sglangs_own  # noqa: E402

from faser_sglang import spec_alloc  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()

    from sglang.srt.mem_cache import allocation

    allocation.assign_req_to_token_pool_func = lambda *a: None  # the slot write: the same launch on both sides
    original = sglangs_own()
    sides = {
        "SGLang": lambda tree_cache, pool, kwargs: original(tree_cache, pool, **kwargs),
        "host list": lambda tree_cache, pool, kwargs: spec_alloc.lengths_as_list(original, tree_cache, pool, **kwargs),
    }
    print("| requests | SGLang ms | host list ms | ratio |\n|---|---|---|---|")
    for bs in args.batch_sizes:
        cur = list(range(100, 100 + bs))
        nxt = [c + 9 for c in cur]
        medians = {}
        for name, call in sides.items():
            times = []
            for _ in range(args.rounds):
                tree_cache, pool, kwargs = _step(cur, nxt)
                start = time.perf_counter()
                call(tree_cache, pool, kwargs)
                times.append(time.perf_counter() - start)
            medians[name] = 1e3 * statistics.median(times)
        sglang, host = medians["SGLang"], medians["host list"]
        print(f"| {bs} | {sglang:.3f} | {host:.3f} | {sglang / host:.1f}x |")


if __name__ == "__main__":
    main()
