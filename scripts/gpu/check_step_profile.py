"""Does the step profile read a real CUDA trace? A synthetic drafting step, profiled.

    python3 scripts/gpu/check_step_profile.py [--out DIR]

Needs PyTorch with CUDA only (no SGLang). Records, with torch.profiler (CPU and CUDA
activities, as SGLang's ``/start_profile`` does), steps shaped like a FASER drafting
step under FASER's own ranges (``metrics.annotate``, ``PhaseRanges``): an eager matmul
in ``draft.catchup``, a CUDA graph replay in ``draft.chain``, a matmul and a
device-to-host read in ``verify``, a GPU sleep in ``accept``. Then summarises the
trace with ``faser_sglang.bench.step_profile`` and checks what it must see: the step
kind, launches and device time in the catch-up, one graph launch in the chain, a wait
in the verify, the device busy. Prints the summary and each check; exits 1 if one fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from faser_sglang.bench import step_profile
from faser_sglang.metrics import PhaseRanges, annotate

STEPS = 6


def profile_steps(out: Path) -> list[dict]:
    """The summary of STEPS synthetic drafting steps of 4 requests."""
    x = torch.randn(4, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    graph_in = torch.randn(4, 1024, device="cuda")
    for _ in range(3):  # cuBLAS sets up its workspace before the capture
        graph_in @ w
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = graph_in
        for _ in range(4):
            graph_out = graph_out @ w
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=False, record_shapes=False) as prof:
        for _ in range(STEPS):
            with annotate("decode bs=4"):
                ranges = PhaseRanges()
                ranges.begin("settle")
                ranges.begin("policy")
                ranges.begin("draft")
                with annotate("draft.catchup"):
                    y = x @ w
                with annotate("draft.chain"):
                    graph.replay()
                ranges.begin("verify")
                (y @ w).sum().item()  # waits for the device
                ranges.begin("accept")
                torch.cuda._sleep(1_000_000)
                ranges.end()
        torch.cuda.synchronize()
    path = out / "synthetic.trace.json.gz"
    prof.export_chrome_trace(str(path))
    return step_profile.summarize(step_profile.steps(step_profile.parse(step_profile.load_events(path))))


def checks(groups: list[dict]) -> dict[str, bool]:
    """What the summary must show, by name."""
    if [(g["kind"], g["batch_size"]) for g in groups] != [("drafting/catchup+chain", 4)]:
        return {"one group, drafting/catchup+chain at 4 requests": False}
    g = groups[0]
    ph = g["phases"]
    return {
        f"{STEPS - 1} steps (the last left out)": g["steps"] == STEPS - 1,
        "catch-up launches a kernel": ph["draft.catchup"]["launches"] >= 1,
        "catch-up device time": ph["draft.catchup"]["gpu_ms"] > 0,
        "chain launches one graph": ph["draft.chain"]["graphs"] == 1,
        "chain's graph kernels matched to its launch": ph["draft.chain"]["gpu_ms"] > 0,
        "verify waits for the device": ph["verify"]["sync_ms"] + ph["verify"]["copy_ms"] > 0,
        "accept's sleep kernel": ph["accept"]["gpu_ms"] > 0.1,
        "device busy in the step's period": g["device_busy_ms"] > 0,
        "draft holds its sub-phases' launches": ph["draft"]["launches"]
        >= ph["draft.catchup"]["launches"] + ph["draft.chain"]["launches"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="where the trace is written (default: a temporary folder)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        groups = profile_steps(out)
    print(step_profile.markdown(groups, title=f"synthetic drafting steps on {torch.cuda.get_device_name()}"))
    results = checks(groups)
    for name, ok in results.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
