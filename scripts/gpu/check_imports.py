#!/usr/bin/env python3
"""Import check for the offline SGLang bundle; run ON the GPU machine after install_bundle.sh:

    eval "$(scripts/gpu/install_bundle.sh /tmp/sgl-site | tail -1)"
    python3 scripts/gpu/check_imports.py [-v]

Prints one line per module (OK / FAIL with the exception) and one line per expected package.
When an import fails on a missing top-level module, that module is replaced by a stub and the
import is retried, so a single run lists every missing package on the path, not only the first.
Exit code = number of failures (capped at 100).
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import time
import traceback
import types
from unittest import mock

VERBOSE = "-v" in sys.argv[1:]

MODULES = [
    "transformers",
    "flashinfer",
    "sgl_kernel",
    "xgrammar",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.layers.attention.flashinfer_backend",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.models.llama",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.speculative.ngram_worker",
    # what eagle_worker_v2._capture_cuda_graphs imports lazily (STANDALONE + CUDA graphs)
    "sglang.srt.layers.attention.dsa_backend",
    "sglang.srt.layers.attention.deepseek_v4_backend",
    "sglang.srt.layers.attention.flashmla_backend",
    "deep_gemm",
    "sgl_kernel.flash_mla",
]

# Top-level modules every one of which must be importable-by-name (bundle + image); checked with
# find_spec so a missing package shows up even when an earlier failure hides it.
PACKAGES = [
    "sglang", "sgl_kernel", "flashinfer", "tvm_ffi", "xgrammar", "deep_gemm", "transformers",
    "tokenizers", "fastapi", "starlette", "opentelemetry", "python_multipart", "uvicorn",
    "zmq", "orjson", "msgspec", "pybase64", "setproctitle", "partial_json_parser", "zstandard",
    "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "openai", "jiter", "distro",
    "sniffio", "IPython", "traitlets", "pexpect", "prompt_toolkit", "wcwidth", "stack_data",
    "compressed_tensors", "loguru", "gguf", "dill", "jsonschema", "referencing", "rpds", "soundfile",
    "cffi", "pycparser",
    # from the image
    "torch", "triton", "numpy", "huggingface_hub", "safetensors", "sentencepiece", "tiktoken",
    "aiohttp", "requests", "uvloop", "psutil", "prometheus_client", "einops", "jinja2", "yaml",
    "PIL", "torchvision", "pynvml", "h11", "anyio", "httpx", "click", "packaging", "xxhash", "regex",
]

EXPECTED_VERSIONS = {"sglang": "0.5.17", "transformers": "5.12.1", "tokenizers": "0.22.2",
                     "flashinfer-python": "0.6.15.post1", "sglang-kernel": "0.4.5", "xgrammar": "0.2.1"}

_stubbed = {}  # top-level name -> first module whose import needed it


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in _stubbed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_StubFinder())


def _fmt(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_module(name):
    missing, first_err = [], None
    t0 = time.time()
    for _ in range(20):
        try:
            importlib.import_module(name)
            break
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if not top or top in _stubbed or top.startswith(("sglang", "sgl_kernel", "flashinfer")):
                first_err = first_err or e
                break
            _stubbed[top] = name
            missing.append(top)
            first_err = first_err or e
            if VERBOSE:
                traceback.print_exc()
        except BaseException as e:  # noqa: BLE001 -- report everything, incl. SystemExit from deps
            first_err = first_err or e
            if VERBOSE:
                traceback.print_exc()
            break
    dt = time.time() - t0
    if first_err is None:
        print(f"OK    {name}  ({dt:.1f}s)", flush=True)
        return 0
    extra = f"  [missing: {', '.join(missing)}]" if missing else ""
    print(f"FAIL  {name}: {_fmt(first_err)}{extra}", flush=True)
    return 1


def main():
    print(f"python {sys.version.split()[0]}  PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    failures = 0

    # packages first: find_spec does not import, so it is not disturbed by stubs
    missing_pkgs = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    for p in missing_pkgs:
        print(f"FAIL  package {p}: not found")
    failures += len(missing_pkgs)
    print(f"{'OK' if not missing_pkgs else 'FAIL'}    {len(PACKAGES) - len(missing_pkgs)}/{len(PACKAGES)} packages found")

    for dist, want in EXPECTED_VERSIONS.items():
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != want:
            print(f"FAIL  version {dist}: want {want}, got {have} (is the bundle first on PYTHONPATH?)")
            failures += 1

    try:
        import torch
        print(f"info  torch {torch.__version__} cuda={torch.version.cuda} "
              f"gpu={torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")
    except Exception as e:  # noqa: BLE001
        print(f"FAIL  torch: {_fmt(e)}")
        failures += 1

    for name in MODULES:
        failures += check_module(name)

    sk = sys.modules.get("sgl_kernel")
    if sk is not None and hasattr(sk, "common_ops"):
        print(f"info  sgl_kernel.common_ops = {getattr(sk.common_ops, '__file__', '?')}")
    for mod in ("transformers", "flashinfer", "xgrammar"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            print(f"info  {mod} {getattr(m, '__version__', '?')} from {os.path.dirname(m.__file__)}")
    if _stubbed:
        print("MISSING packages (stubbed to continue): "
              + ", ".join(f"{k} (needed by {v})" for k, v in sorted(_stubbed.items())))
    print(f"{failures} failure(s)")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
