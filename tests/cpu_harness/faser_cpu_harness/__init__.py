"""SGLang plugin that lets the ``intel_amx`` attention backend serve on any x86 CPU.

SGLang calls :func:`register` in every process (entry point group
``sglang.srt.plugins``) and then applies the hooks it registered. Nothing in
site-packages is edited; all changes are ``HookRegistry`` hooks and only
happen when ``SGLANG_USE_CPU_ENGINE=1``.

Why each hook exists:

* ``intel_amx`` is the only CPU attention backend with speculative verify
  support, but on CPUs without AMX SGLang silently rewrites it to
  ``torch_native``. The numerics of the stand-in kernels do not need AMX, so
  the rewrite is suppressed.
* SGLang 0.5.17's ``IntelAMXAttnBackend.forward_extend`` / ``forward_decode``
  compute the right sequence lengths for speculative verify and multi-step
  draft decode, then overwrite them with ``forward_batch.seq_lens``. Verify
  then ignores the tokens committed in the previous round and draft decode
  ignores earlier draft tokens, so speculative output diverges from plain
  decoding. The hooks present the right lengths for the duration of the call.
* SGLang's overlap schedule for speculative decoding records the request-pool
  indices on the current stream (``Tensor.record_stream``), which PyTorch only
  implements for accelerator tensors; a CPU has no streams, so recording one on a
  CPU tensor is made a no-op.
* NGRAM's JIT-compiled corpus (``ngram_corpus/result.h``) uses ``size_t``
  without including ``<cstddef>``, which g++ 12 rejects; the header is
  force-included when that module is built.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

_OVERRIDES = "sglang.srt.arg_groups.overrides"
_PLATFORM_FALLBACKS = f"{_OVERRIDES}._attention_backend_platform_fallbacks"
_AMX_MODULE = "sglang.srt.layers.attention.intel_amx_backend"
_AMX_CLASS = "IntelAMXAttnBackend"
_LOAD_JIT = "sglang.kernels.jit.utils.compile.load_jit"


def register() -> None:
    """Register the CPU hooks; a no-op unless ``SGLANG_USE_CPU_ENGINE=1``."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_PLATFORM_FALLBACKS, _keep_intel_amx, HookType.AROUND)
    _route_pass_list_through_module()
    HookRegistry.register(_LOAD_JIT, _ngram_corpus_with_cstddef, HookType.AROUND)
    _cpu_record_stream_is_a_no_op()

    buggy = _methods_overwriting_seq_lens()
    if "forward_extend" in buggy:
        HookRegistry.register(
            f"{_AMX_MODULE}.{_AMX_CLASS}.forward_extend",
            _extend_with_metadata_seq_lens,
            HookType.AROUND,
        )
    if "forward_decode" in buggy:
        HookRegistry.register(
            f"{_AMX_MODULE}.{_AMX_CLASS}.forward_decode",
            _decode_with_draft_seq_lens,
            HookType.AROUND,
        )


def _keep_intel_amx(original: Callable[[Any], dict], view: Any) -> dict:
    """Skip the intel_amx -> torch_native rewrite on CPUs without AMX."""
    if view.device == "cpu" and view.attention_backend == "intel_amx":
        return {}
    return original(view)


def _route_pass_list_through_module() -> None:
    """Make the registered post-process pass list call the hooked function.

    ``register_post_process`` stored the original function object in
    ``POST_PROCESS_PASSES``; a hook only rebinds the module attribute, so the
    list entry is replaced by a forwarder that looks the name up at call time.
    """
    import sglang.srt.arg_groups.overrides as overrides

    original = overrides._attention_backend_platform_fallbacks
    passes = overrides.POST_PROCESS_PASSES
    if original not in passes:
        return

    @functools.wraps(original)
    def call_by_name(view: Any) -> dict:
        return overrides._attention_backend_platform_fallbacks(view)

    passes[passes.index(original)] = call_by_name


def _cpu_record_stream_is_a_no_op() -> None:
    original = torch.Tensor.record_stream
    if getattr(original, "_faser_cpu_harness", False):
        return

    @functools.wraps(original)
    def record_stream(tensor: torch.Tensor, stream: Any) -> None:
        if tensor.device.type != "cpu":
            original(tensor, stream)

    record_stream._faser_cpu_harness = True  # type: ignore[attr-defined]
    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]


def _ngram_corpus_with_cstddef(
    original: Callable[..., Any], *args: str, **kwargs: Any
) -> Any:
    """Build the NGRAM corpus JIT module with ``<cstddef>`` force-included."""
    if args[:1] == ("ngram_corpus",):
        kwargs["extra_cflags"] = [*(kwargs.get("extra_cflags") or []), "-include", "cstddef"]
    return original(*args, **kwargs)


def _methods_overwriting_seq_lens() -> set[str]:
    """Names of intel_amx backend methods with the seq_lens overwrite bug.

    The bug is a statement ``seq_lens = forward_batch.seq_lens`` directly in
    the method body that follows an earlier binding of ``seq_lens`` (the
    correct lengths), discarding it. The module source is parsed rather than
    imported, because plugins load before SGLang is fully initialised.
    """
    spec = importlib.util.find_spec(_AMX_MODULE)
    if spec is None or spec.origin is None:
        return set()
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    buggy: set[str] = set()
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == _AMX_CLASS):
            continue
        for method in cls.body:
            if isinstance(method, ast.FunctionDef) and _discards_seq_lens(method):
                buggy.add(method.name)
    return buggy


def _discards_seq_lens(method: ast.FunctionDef) -> bool:
    bound = False
    for stmt in method.body:
        if bound and _is_seq_lens_overwrite(stmt):
            return True
        bound = bound or any(
            isinstance(node, ast.Name)
            and node.id == "seq_lens"
            and isinstance(node.ctx, ast.Store)
            for node in ast.walk(stmt)
        )
    return False


def _is_seq_lens_overwrite(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id == "seq_lens"
        and isinstance(stmt.value, ast.Attribute)
        and stmt.value.attr == "seq_lens"
        and isinstance(stmt.value.value, ast.Name)
        and stmt.value.value.id == "forward_batch"
    )


@contextlib.contextmanager
def _seq_lens_overridden(forward_batch: Any, seq_lens: torch.Tensor) -> Iterator[None]:
    saved = forward_batch.seq_lens
    forward_batch.seq_lens = seq_lens
    try:
        yield
    finally:
        forward_batch.seq_lens = saved


def _forward_batch_arg(original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return inspect.signature(original).bind(*args, **kwargs).arguments["forward_batch"]


def _extend_with_metadata_seq_lens(
    original: Callable[..., torch.Tensor], backend: Any, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """Run forward_extend with the lengths from its per-pass extend metadata.

    For TARGET_VERIFY those are prefix + draft tokens; for other extend
    modes they equal ``forward_batch.seq_lens``.
    """
    metadata = backend.extend_metadata
    if metadata is None:
        return original(backend, *args, **kwargs)
    forward_batch = _forward_batch_arg(original, (backend, *args), kwargs)
    with _seq_lens_overridden(forward_batch, metadata[0]):
        return original(backend, *args, **kwargs)


def _decode_with_draft_seq_lens(
    original: Callable[..., torch.Tensor], backend: Any, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """Run forward_decode with the multi-step draft lengths when drafting.

    Draft step s attends to prefix + s + 1 draft tokens; outside drafting
    the lengths are ``forward_batch.seq_lens`` and nothing changes.
    """
    metadata = backend.draft_decode_metadata
    if metadata is None:
        return original(backend, *args, **kwargs)
    forward_batch = _forward_batch_arg(original, (backend, *args), kwargs)
    with _seq_lens_overridden(forward_batch, metadata[1]):
        return original(backend, *args, **kwargs)
