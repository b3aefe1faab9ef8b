"""What a CUDA graph launch costs the host, by graph size and shape, with and without a profiler.

    python3 scripts/gpu/graph_launch.py [--nodes 64 256 1024] [--out DIR]

A decode step's graphs launch from the host before their kernels run: in the step
profiles a draft chain of 973 kernel nodes took 2.3 ms inside ``cudaGraphLaunch`` and
the target's verify of 628 nodes 1.4 ms, about 2.3 us per node, on the step's critical
path. Those numbers come from torch.profiler traces, whose CUDA activity tracing may
itself slow a launch. This captures synthetic graphs of N tiny kernels and times the
host side of ``CUDAGraph.replay()`` (no synchronisation inside the timed call):

- ``line``: one stream, kernel nodes only, each depending on the last;
- ``fork``: the same kernels split across two streams that fork and join every 16
  kernels (what a model that overlaps work on a side stream captures);
- ``memcpy``: the line with a device-to-device copy node every 16 kernels;

each launched with the GPU idle (synchronised first), behind 20 ms of queued GPU work,
and idle under torch.profiler with CUDA activities. Median of 30 launches after 5
warm-up ones. With ``cuda.bindings`` importable, the node types of each graph are
counted (``CUDAGraph.get_graph_data``). Writes DIR/graph-launch.json and prints a
Markdown table (us per launch and per node).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.profiler import ProfilerActivity

from check_h2d_sync import sleep_cycles_for  # this folder: the script's own

SHAPES = ("line", "fork", "memcpy")
CONDITIONS = ("idle", "busy", "profiled")
EVERY = 16  # kernels between a shape's forks or copies
WARMUP, ROUNDS = 5, 30
BUSY_MS = 20.0


def capture(shape: str, nodes: int) -> torch.cuda.CUDAGraph:
    """A graph of ``nodes`` small kernels in ``shape`` (module docstring)."""
    x = torch.zeros(256, device="cuda")
    y = torch.zeros(256, device="cuda")
    side = torch.cuda.Stream()
    graph = new_graph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        for i in range(nodes):
            if shape == "fork" and i % EVERY == 0:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    y.add_(1.0)  # one kernel on the side stream
                main.wait_stream(side)
                continue
            if shape == "memcpy" and i % EVERY == 0:
                y.copy_(x)  # contiguous, same dtype: a memcpy node
                continue
            x.add_(1.0)
    if hasattr(graph, "instantiate"):
        graph.instantiate()
    return graph


def new_graph() -> torch.cuda.CUDAGraph:
    """A graph whose template outlives its capture where this torch can keep it (for
    ``node_types``)."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # a torch without keep_graph
        return torch.cuda.CUDAGraph()


def node_types(graph: torch.cuda.CUDAGraph) -> Optional[dict[str, int]]:
    """Node type -> count, or None where this torch cannot list them (no cuda.bindings,
    no ``get_graph_data``, or no kept template)."""
    try:
        data = graph.get_graph_data()
    except (AttributeError, ImportError, RuntimeError):
        return None
    return dict(Counter(node["node_type"] for node in data["nodes"]))


def launch_us(graph: torch.cuda.CUDAGraph, before: Callable[[], None]) -> float:
    """Median host microseconds inside ``graph.replay()``, ``before`` run ahead of each."""
    times = []
    for i in range(WARMUP + ROUNDS):
        torch.cuda.synchronize()
        before()
        start = time.perf_counter()
        graph.replay()
        elapsed = time.perf_counter() - start
        if i >= WARMUP:
            times.append(elapsed * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def measure(shape: str, nodes: int, busy_cycles: int) -> dict:
    graph = capture(shape, nodes)
    row: dict = {"shape": shape, "nodes": nodes, "node_types": node_types(graph)}
    for condition in CONDITIONS:
        before = (lambda: torch.cuda._sleep(busy_cycles)) if condition == "busy" else (lambda: None)
        profiler = (
            torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            if condition == "profiled"
            else nullcontext()
        )
        with profiler:
            row[condition] = launch_us(graph, before)
    return row


def table(rows: list[dict]) -> str:
    header = ["shape", "nodes", *(f"{c} us (per node)" for c in CONDITIONS), "node types"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["shape"], str(r["nodes"])]
        cells += [f"{r[c]:.0f} ({r[c] / r['nodes']:.2f})" for c in CONDITIONS]
        types = r["node_types"]
        cells.append("-" if types is None else ", ".join(f"{k} {v}" for k, v in sorted(types.items())))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    busy = sleep_cycles_for(BUSY_MS)
    rows = [measure(shape, n, busy) for shape in SHAPES for n in args.nodes]
    info = {
        "device": torch.cuda.get_device_name(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "busy_ms": BUSY_MS,
        "rows": rows,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "graph-launch.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"{info['device']}, torch {info['torch']}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
