"""FlashInfer's prefill plan behind queued GPU work, given device or host index pointers.

    python3 scripts/gpu/check_prefill_plan.py [--busy-ms 50]

SGLang 0.5.17 hands FlashInfer's prefill plans index pointers built on the device;
``FASER_HOST_PREFILL_PLAN`` (faser_sglang/host_plan.py) hands them host copies. With
about ``--busy-ms`` of GPU work queued (``torch.cuda._sleep``), this prints:

1. the host ms of a ragged and of a paged plan, pointers on the device and on the host
   (median of 5): the first waits for the queued work, the second should not;
2. whether the ragged attention's output is the same, bit for bit, under both plans;
3. the page-locked buffer a plan writes its schedule into, copied to the device behind
   the queued work: batch A is planned and its attention queued, then batch B (the same
   rows, split otherwise) is planned on the same wrapper before A's copy ran. A's output
   against its reference, with B's plan first waiting for an event recorded after A's
   plan, without that wait (shows whether a wait is needed), and without it but into
   another page-locked buffer (as host_plan.py's plans take turns among buffers). If
   section 1's host-pointer plans wait too, the copies are synchronous here and this
   section cannot show the race.
"""

from __future__ import annotations

import argparse
import statistics
import time

import flashinfer
import torch
from check_h2d_sync import sleep_cycles_for  # this script's directory is on sys.path

HEADS, KV_HEADS, HEAD_DIM = 80, 16, 64  # the 13.5B pair's attention shape (cost-faithful-14b)
A = [100, 37, 64, 5]  # new tokens per row of batch A
# B: A's total (206 rows) in other rows, so A's kernel run on B's schedule stays within
# its tensors and computes a wrong answer instead of faulting
B = [130, 60, 16]
ROUNDS = 5


def indptr(lens: list[int], device: str) -> torch.Tensor:
    """[len(lens) + 1] int32 prefix sums, on ``device``."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lens), 0)
    return out.to(device)


def ragged_args(lens: list[int], device: str) -> tuple:
    qo = indptr(lens, device)
    return (qo, qo, HEADS, KV_HEADS, HEAD_DIM)


def paged_args(lens: list[int], device: str) -> tuple:
    kv_lens = [n + 50 for n in lens]  # a 50-token cached prefix per row
    indices = torch.arange(sum(kv_lens), dtype=torch.int32, device="cuda")
    last_page = torch.ones(len(lens), dtype=torch.int32).to(device)
    return (indptr(lens, device), indptr(kv_lens, device), indices, last_page, HEADS, KV_HEADS, HEAD_DIM, 1)


def plan(wrapper, args: tuple) -> None:
    """SGLang's plan call (positional pointers and shape, then the data types)."""
    wrapper.plan(*args, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)


def host_ms(wrapper, args: tuple, cycles: int) -> float:
    """Median host ms of the plan with ``args`` (built beforehand: a blocking copy of
    device pointers would wait for the queued work before the plan starts)."""
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        started = time.perf_counter()
        plan(wrapper, args)
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
    for wrapper, build in ((ragged, ragged_args), (paged, paged_args)):
        plan(wrapper, build(A, "cuda"))  # first plans compile and load the kernels
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {flashinfer.__version__}, "
          f"~{args.busy_ms:.0f} ms of GPU work queued\n")  # fmt: skip
    print("| plan | pointers on the device: host ms | pointers on the host: host ms |")
    print("|---|---|---|")
    for name, wrapper, build in (("ragged", ragged, ragged_args), ("paged", paged, paged_args)):
        on_device = host_ms(wrapper, build(A, "cuda"), cycles)
        on_host = host_ms(wrapper, build(A, "cpu"), cycles)
        print(f"| {name} | {on_device:.3f} | {on_host:.3f} |")

    q, k, v = qkv(A, seed=0)
    plan(ragged, ragged_args(A, "cuda"))
    reference = ragged.run(q, k, v)
    plan(ragged, ragged_args(A, "cpu"))
    same = torch.equal(ragged.run(q, k, v), reference)
    print(f"\nragged attention, host-pointer plan against device-pointer plan: {'identical' if same else 'DIFFERENT'}")

    print("\n| B planned while A's schedule copy is queued | A's output |")
    print("|---|---|")
    plan_a, plan_b = ragged_args(A, "cpu"), ragged_args(B, "cpu")
    own = ragged._pin_memory_int_workspace_buffer
    other = torch.empty_like(own, pin_memory=True)
    cases = (("after waiting for the event", True, own), ("without waiting", False, own),
             ("without waiting, into another page-locked buffer", False, other))  # fmt: skip
    for name, wait, b_buffer in cases:
        ragged._pin_memory_int_workspace_buffer = own
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        plan(ragged, plan_a)
        planned = torch.cuda.Event()  # right after A's schedule copy, as host_plan.py records it
        planned.record()
        out = ragged.run(q, k, v)
        if wait:
            planned.synchronize()
        ragged._pin_memory_int_workspace_buffer = b_buffer
        plan(ragged, plan_b)
        torch.cuda.synchronize()
        verdict = "as its reference" if torch.equal(out, reference) else "CORRUPTED"
        print(f"| {name} | {verdict} |")


if __name__ == "__main__":
    main()
