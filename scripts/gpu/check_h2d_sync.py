"""How long the host waits for a small host-to-device copy issued behind queued GPU work.

    python3 scripts/gpu/check_h2d_sync.py [--busy-ms 50]

Queues about ``--busy-ms`` of GPU work (``torch.cuda._sleep``), then times on the host
the call that copies a list of ints to the GPU, for each way of copying and a few
sizes (median of 5). A call that returns in microseconds leaves the host free to
prepare the next forward; one that takes about the busy time waited for the GPU.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from faser_sglang.tensors import device_tensor

SIZES = (8, 512, 16384)
ROUNDS = 5

COPIES: dict[str, Callable[[list[int]], torch.Tensor]] = {
    "device_tensor (pageable, non_blocking)": lambda v: device_tensor(v, "cuda"),
    "pageable, blocking": lambda v: torch.tensor(v, dtype=torch.int64).to("cuda"),
    "pinned, non_blocking": lambda v: torch.tensor(v, dtype=torch.int64, pin_memory=True).to("cuda", non_blocking=True),
}


def sleep_cycles_for(ms: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``ms``."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * ms / start.elapsed_time(end))


def host_ms(copy: Callable[[list[int]], torch.Tensor], values: list[int], cycles: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    started = time.perf_counter()
    out = copy(values)
    elapsed = (time.perf_counter() - started) * 1e3
    torch.cuda.synchronize()
    assert out.tolist() == values
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy-ms", type=float, default=50.0)
    args = p.parse_args()
    cycles = sleep_cycles_for(args.busy_ms)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, ~{args.busy_ms:.0f} ms of GPU work queued\n")
    print("| copy | " + " | ".join(f"{n} ints: host ms" for n in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for name, copy in COPIES.items():
        for n in SIZES:  # warm-up: the caching host allocator's first pinned blocks
            host_ms(copy, list(range(n)), 0)
        cells = [statistics.median(host_ms(copy, list(range(n)), cycles) for _ in range(ROUNDS)) for n in SIZES]
        print(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
