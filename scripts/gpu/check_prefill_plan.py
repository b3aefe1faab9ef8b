"""FlashInfer's prefill plan behind queued GPU work, given device or host index pointers.

    python3 scripts/gpu/check_prefill_plan.py [--busy-ms 50]

SGLang 0.5.17 hands FlashInfer's prefill plans index pointers built on the device;
``FASER_HOST_PREFILL_PLAN`` (faser_sglang/host_plan.py) hands them host copies. With
about ``--busy-ms`` of GPU work queued (``torch.cuda._sleep``), this prints:

1. the host ms of a ragged and of a paged plan, pointers on the device and on the host
   (median of 5): the first waits for the queued work, the second should not;
2. whether the ragged attention's output is the same, bit for bit, under both plans;
3. the page-locked buffer a plan writes its schedule into, copied to the device behind
   the queued work: batch A is planned and its attention queued, then batch B is planned
   on the same wrapper before A's copy ran. A's output against its reference, with B's
   plan first waiting for an event recorded after A's plan (as host_plan.py does) and
   without that wait (shows whether the wait is needed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import flashinfer
import torch

HEADS, KV_HEADS, HEAD_DIM = 40, 8, 128  # the 13.5B pair's attention shape
A = [100, 37, 64, 5]  # new tokens per row of batch A
B = [300, 1]
ROUNDS = 5


def sleep_cycles_for(ms: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``ms``."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * ms / start.elapsed_time(end))


def indptr(lens: list[int], device: str) -> torch.Tensor:
    """[len(lens) + 1] int32 prefix sums, on ``device``."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lens), 0)
    return out.to(device)


def ragged_plan(wrapper, lens: list[int], device: str) -> None:
    qo = indptr(lens, device)
    wrapper.plan(qo, qo, HEADS, KV_HEADS, HEAD_DIM, causal=True, q_data_type=torch.bfloat16)


def paged_plan(wrapper, lens: list[int], device: str) -> None:
    qo = indptr(lens, device)
    kv_lens = [n + 50 for n in lens]  # a 50-token cached prefix per row
    kv = indptr(kv_lens, device)
    indices = torch.arange(sum(kv_lens), dtype=torch.int32, device="cuda")
    last_page = torch.ones(len(lens), dtype=torch.int32, device=device)
    wrapper.plan(qo, kv, indices, last_page, HEADS, KV_HEADS, HEAD_DIM, 1, causal=True,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip


def host_ms(plan, wrapper, lens: list[int], device: str, cycles: int) -> float:
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        started = time.perf_counter()
        plan(wrapper, lens, device)
        times.append((time.perf_counter() - started) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def qkv(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = sum(lens)
    return tuple(
        torch.randn(n, heads, HEAD_DIM, generator=g, device="cuda", dtype=torch.bfloat16)
        for heads in (HEADS, KV_HEADS, KV_HEADS)
    )


def workspace() -> torch.Tensor:
    return torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy-ms", type=float, default=50.0)
    args = p.parse_args()
    cycles = sleep_cycles_for(args.busy_ms)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD")
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    for plan, wrapper in ((ragged_plan, ragged), (paged_plan, paged)):
        plan(wrapper, A, "cuda")  # first plans compile and load the kernels
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {flashinfer.__version__}, "
          f"~{args.busy_ms:.0f} ms of GPU work queued\n")  # fmt: skip
    print("| plan | pointers on the device: host ms | pointers on the host: host ms |")
    print("|---|---|---|")
    for name, plan, wrapper in (("ragged", ragged_plan, ragged), ("paged", paged_plan, paged)):
        on_device = host_ms(plan, wrapper, A, "cuda", cycles)
        on_host = host_ms(plan, wrapper, A, "cpu", cycles)
        print(f"| {name} | {on_device:.3f} | {on_host:.3f} |")

    q, k, v = qkv(A, seed=0)
    ragged_plan(ragged, A, "cuda")
    reference = ragged.run(q, k, v)
    ragged_plan(ragged, A, "cpu")
    same = torch.equal(ragged.run(q, k, v), reference)
    print(f"\nragged attention, host-pointer plan against device-pointer plan: {'identical' if same else 'DIFFERENT'}")

    print("\n| B planned while A's schedule copy is queued | A's output |")
    print("|---|---|")
    for wait in (True, False):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        ragged_plan(ragged, A, "cpu")
        out = ragged.run(q, k, v)
        planned = torch.cuda.Event()
        planned.record()
        if wait:
            planned.synchronize()
        ragged_plan(ragged, B, "cpu")
        torch.cuda.synchronize()
        verdict = "as its reference" if torch.equal(out, reference) else "CORRUPTED"
        print(f"| {'after waiting for the event' if wait else 'without waiting'} | {verdict} |")


if __name__ == "__main__":
    main()
