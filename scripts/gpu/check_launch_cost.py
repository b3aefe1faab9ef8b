"""Whether instantiated CUDA graphs make eager kernel launches dearer on the host.

    python3 scripts/gpu/check_launch_cost.py [--graphs 0 40 160] [--nodes 600]

A speculative server holds hundreds of captured graphs (the draft's chains at every
batch size) besides the target's decode graphs; its eager prefills launch their kernels
one by one. This times, on the host, one eager launch of a one-element kernel (median
of 7 rounds of 500 launches, the GPU drained before each round), first with no graph,
then after capturing more graphs of ``--nodes`` kernels each, up to every count in
``--graphs``. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

LAUNCHES = 500
ROUNDS = 7


def launch_us(x: torch.Tensor) -> float:
    """Median host microseconds per eager launch of a one-element kernel."""
    rounds = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(LAUNCHES):
            x.add_(1)
        rounds.append((time.perf_counter() - started) * 1e6 / LAUNCHES)
    torch.cuda.synchronize()
    return statistics.median(rounds)


def capture(nodes: int, pool) -> torch.cuda.CUDAGraph:
    """One graph of ``nodes`` one-element kernels, in the shared memory pool."""
    y = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y.add_(1)  # warm-up outside the capture, as torch recommends
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        for _ in range(nodes):
            y.add_(1)
    return graph


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", type=int, nargs="+", default=[0, 40, 160])
    p.add_argument("--nodes", type=int, default=600)
    args = p.parse_args()
    x = torch.zeros(1, device="cuda")
    launch_us(x)  # first launches load the kernel
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.nodes} kernels a graph\n")
    print("| graphs held | kernel nodes held | host us per eager launch | capture s |")
    print("|---|---|---|---|")
    graphs: list[torch.cuda.CUDAGraph] = []
    pool = torch.cuda.graph_pool_handle()
    for count in sorted(args.graphs):
        started = time.perf_counter()
        while len(graphs) < count:
            graphs.append(capture(args.nodes, pool))
        seconds = time.perf_counter() - started
        print(f"| {count} | {count * args.nodes} | {launch_us(x):.2f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
