"""Host timeline of SGLang's scheduler loop, for any server, with or without FASER.

With ``FASER_SCHED_TIMELINE=<dir>`` in its environment, every scheduler process of a
server writes ``<dir>/sched-<pid>.jsonl``. Its first line is a header naming the
server's speculative algorithm. Then there is one line per call of these functions:

- ``Scheduler.get_next_batch_to_run``: picks the iteration's batch;
- ``Scheduler.run_batch``: launches it;
- ``Scheduler.process_batch_result``: waits for a batch's result on the overlap
  schedule, then streams it;
- ``FutureMap.resolve_seq_lens_cpu``: a speculative decode batch waits here for the
  previous step's published lengths;
- ``TpModelWorker.forward_batch_generation`` ("target_forward"): the target model's
  forward through SGLang's worker, inside ``run_batch``: every forward of a server
  without speculation, every server's prefills, the verifies of SGLang's own
  speculative servers, and FASER's plain decode steps (FASER's verify of drafts runs
  the target's model runner directly and is not recorded here). On a prefill, what
  ``run_batch`` spends outside it is the server's own work around the target's.

Each line is ``{"fn", "t", "ms", "mode", "bs", "tokens"}``:
- ``t``: ``time.perf_counter()`` at entry, in seconds;
- ``ms``: the call's host time, any wait for the GPU inside it included;
- ``mode``: "prefill", "decode", "verify" (a target forward over drafts), "idle"
  (nothing to run; only the first of a run of idle loop turns is recorded) or another
  SGLang forward mode;
- ``bs`` and ``tokens``: the batch's requests and the tokens it feeds (for a
  target forward given SGLang's ForwardBatch instead of a batch: its rows and input
  tokens; None for a verify's batch).

With the timeline open, every Triton JIT compile of the process is a line too,
``{"fn": "triton_compile", "t", "ms", "kernel", "module", "spec", "key"}``: the kernel's name,
its Python module (two of SGLang's attention kernels are both ``_fwd_kernel``), Triton's
description of the specialization it compiled (argument types, pointers' 16-byte
alignment, integers equal to 1 or divisible by 16, compile-time constants; the GPU image's
Triton 3.6 prints the argument part empty) and Triton's cache key for it, which tells two
variants of one kernel apart. Triton
compiles a kernel for each new specialization, inside whatever call launched it, so a
loop iteration that holds one waited for the compiler (or for its on-disk cache):
``ms`` runs from Triton's cache hook, before the compile, to its post-compile hook.
The scheduler's first batch pick opens the file and sets the hooks, so compiles before it
(model loading, graph capture) are not recorded; the header's ``triton_compiles`` says
whether this Triton has the hooks.

A recorded idle pick also carries ``alloc_retries`` and ``device_allocs``: PyTorch's
caching allocator's ``num_alloc_retries`` and ``num_device_alloc`` so far on this
process's GPU (None without CUDA). A retry frees cached blocks and synchronizes the
device, so a server with less free memory (a draft model beside the target) can stall
where another does not; a device allocation (cudaMalloc) past startup means an eager
forward (a prefill's) found no cached block to reuse and waited for a new one. The
header names the server's ``FASER_CONFIG`` file, whether it plans prefills from host
lengths and its prefill CUDA graph backend, which tell apart the servers of one run.

Nothing here synchronizes the device, so a traced server keeps its overlap. Each
call costs the host one JSON line, written line-buffered: ~16 us on a 2-core CPU.
That is up to 5 calls per iteration, a few percent of a 3 ms decode iteration. The hooks go in
through SGLang's HookRegistry (plugin.py). ``scripts/sched_timeline.py`` reads the
files.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import torch

from faser_sglang import host_plan
from faser_sglang.config import CONFIG_ENV

TIMELINE_ENV = "FASER_SCHED_TIMELINE"

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
FUTURE_MAP = "sglang.srt.managers.overlap_utils.FutureMap"
TP_WORKER = "sglang.srt.managers.tp_worker.TpModelWorker"

_file: Optional[TextIO] = None
_idle = False  # the latest get_next_batch_to_run found nothing to run


def timeline_dir() -> Optional[Path]:
    value = os.environ.get(TIMELINE_ENV)
    return Path(value) if value else None


def server_label(algorithm: Optional[str], num_steps: Optional[int]) -> str:
    """A server's name in reports: "no-spec", or the algorithm and its K, e.g. "faser k7"."""
    if not algorithm:
        return "no-spec"
    return algorithm.lower() + (f" k{num_steps}" if num_steps is not None else "")


def _mode_name(mode: Any) -> str:
    if mode.is_target_verify():  # before is_extend, which includes it
        return "verify"
    if mode.is_extend():
        return "prefill"
    return "decode" if mode.is_decode() else mode.name.lower()


def _batch_fields(batch: Any) -> dict[str, Any]:
    if batch is None:
        return {"mode": "idle", "bs": 0, "tokens": 0}
    name = _mode_name(batch.forward_mode)
    if name == "prefill":
        tokens = batch.extend_num_tokens
    elif name == "decode":
        tokens = len(batch.reqs)
    else:
        tokens = None
    return {"mode": name, "bs": len(batch.reqs), "tokens": tokens}


def _target_fields(args: tuple, kwargs: dict, out: Any) -> dict[str, Any]:
    """``forward_batch_generation(batch, forward_batch=None, ...)``'s batch fields: the
    ScheduleBatch's, or else those of the ForwardBatch passed instead (FASER's plain
    decode, SGLang's speculative verifies), which has rows and input ids, not requests
    (shapes only: no device read)."""
    batch = args[1] if len(args) > 1 else kwargs.get("batch")
    if batch is not None:
        return _batch_fields(batch)
    forward_batch = args[2] if len(args) > 2 else kwargs["forward_batch"]
    return {
        "mode": _mode_name(forward_batch.forward_mode),
        "bs": forward_batch.batch_size,
        "tokens": int(forward_batch.input_ids.shape[0]),
    }


def _open(scheduler: Any) -> TextIO:
    """This process's file; the first call opens it and writes the header from the
    scheduler's server args."""
    global _file
    if _file is None:
        directory = timeline_dir()
        directory.mkdir(parents=True, exist_ok=True)
        _file = open(directory / f"sched-{os.getpid()}.jsonl", "a", buffering=1)
        args = scheduler.server_args
        header = {
            "header": True,
            "pid": os.getpid(),
            "model_path": args.model_path,
            "speculative_algorithm": args.speculative_algorithm,
            "speculative_num_steps": args.speculative_num_steps,
            "overlap": not args.disable_overlap_schedule,
            "faser_config": os.environ.get(CONFIG_ENV),
            "host_prefill_plan": host_plan.enabled(),
            "prefill_graphs": _prefill_graph_backend(args),
            "triton_compiles": watch_triton_compiles(),
        }
        _file.write(json.dumps(header) + "\n")
    return _file


def _timed(
    fn: str, fields_of: Callable[[tuple, dict, Any], dict[str, Any]], scheduler_call: bool = True
) -> Callable:
    """An AROUND hook that records ``fn``'s host time and the batch it handled
    (``fields_of(args, kwargs, result)``). Only a scheduler's call opens the file: the
    header needs the scheduler, and the other calls come after its first batch pick."""

    def hook(original, *args, **kwargs):
        global _idle
        start = time.perf_counter()
        out = original(*args, **kwargs)
        ms = 1e3 * (time.perf_counter() - start)
        if fn == "get_next_batch_to_run":
            # An idle server spins through the loop: its first idle pick closes the busy
            # iteration before it, the rest are not recorded.
            idle = out.batch_to_run is None
            if idle and _idle:
                return out
            _idle = idle
        fields = fields_of(args, kwargs, out)
        if fields["mode"] == "idle" and fn == "get_next_batch_to_run":
            fields.update(_alloc_counts())
        if _file is not None or scheduler_call:
            record = {"fn": fn, "t": round(start, 6), "ms": round(ms, 3), **fields}
            _open(args[0]).write(json.dumps(record) + "\n")
        return out

    return hook


def watch_triton_compiles() -> bool:
    """Record each Triton JIT compile of this process in the timeline, chained after
    any hooks already set (their results pass through: a truthy cache hook result tells
    Triton to skip the compile). False where this Triton has no such hooks."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if not hasattr(runtime, "jit_cache_hook") or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    before_compile, after_compile = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    if getattr(after_compile, "records_timeline", False):
        return True  # set by an earlier call
    started: dict[str, float] = {}

    def cache_hook(**kwargs):
        started[str(kwargs["key"])] = time.perf_counter()
        return before_compile(**kwargs) if before_compile is not None else None

    def post_compile_hook(**kwargs):
        key = str(kwargs["key"])
        start = started.pop(key, None)
        if _file is not None and start is not None:
            record = {
                "fn": "triton_compile",
                "t": round(start, 6),
                "ms": round(1e3 * (time.perf_counter() - start), 3),
                "kernel": getattr(kwargs["fn"], "name", str(kwargs["fn"])),
                "module": getattr(kwargs["fn"], "module", None),
                "spec": kwargs["repr"],
                "key": key,
            }
            _file.write(json.dumps(record) + "\n")
        return after_compile(**kwargs) if after_compile is not None else None

    post_compile_hook.records_timeline = True
    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_compile_hook
    return True


def _prefill_graph_backend(server_args: Any) -> Optional[str]:
    """The prefill CUDA graph backend SGLang resolved ("disabled", "breakable", ...)."""
    config = getattr(server_args, "cuda_graph_config", None)
    backend = getattr(getattr(config, "prefill", None), "backend", None)
    return None if backend is None else str(backend)


def _alloc_counts() -> dict[str, Optional[int]]:
    if not torch.cuda.is_initialized():
        return {"alloc_retries": None, "device_allocs": None}
    stats = torch.cuda.memory_stats()
    return {"alloc_retries": stats.get("num_alloc_retries", 0), "device_allocs": stats.get("num_device_alloc", 0)}


def hooks() -> list[tuple[str, Callable]]:
    """(target, AROUND hook) pairs for HookRegistry."""

    def batch_arg(args: tuple, kwargs: dict, out: Any) -> dict[str, Any]:
        return _batch_fields(args[1])

    def picked(args: tuple, kwargs: dict, out: Any) -> dict[str, Any]:
        return _batch_fields(out.batch_to_run)

    return [
        (f"{SCHEDULER}.get_next_batch_to_run", _timed("get_next_batch_to_run", picked)),
        (f"{SCHEDULER}.run_batch", _timed("run_batch", batch_arg)),
        (f"{SCHEDULER}.process_batch_result", _timed("process_batch_result", batch_arg)),
        (f"{FUTURE_MAP}.resolve_seq_lens_cpu", _timed("resolve_seq_lens_cpu", batch_arg, scheduler_call=False)),
        (f"{TP_WORKER}.forward_batch_generation", _timed("target_forward", _target_fields, scheduler_call=False)),
    ]
