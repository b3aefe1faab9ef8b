"""Launch real SGLang servers on this CPU-only host and talk to them.

Servers run as ``python -m sglang.launch_server`` subprocesses bound to a free
loopback port, with the flags that make SGLang 0.5.17 serve float32 models on
CPU through the ``faser-cpu-harness`` plugin (``tests/cpu_harness``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import requests

HOST = "127.0.0.1"

# Small pools keep a server within 2 cores / a few GB; float32 because the
# stand-in kernels compute in float32 and tiny test models are saved so.
CPU_SERVER_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "intel_amx",
    "--sampling-backend", "pytorch",
    "--dtype", "float32",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "8192",
    "--max-running-requests", "16",
)  # fmt: skip

CPU_SERVER_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1"}


@dataclass
class ServerHandle:
    """A running server: its URL, process and log file.

    Closing kills the whole process tree and removes the log, so read
    ``log_tail()`` first if it is needed; startup failures quote it in
    their exception.
    """

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, num_chars: int = 20000) -> str:
        """Last ``num_chars`` characters of the server's combined output."""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def close(self) -> None:
        """Kill the server and every process it started, then delete its log."""
        _kill_tree(self.process)
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def launch_server(
    model_path: str | os.PathLike[str],
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> ServerHandle:
    """Start an SGLang server on ``model_path`` and wait until it serves.

    ``extra_args`` are appended to the CPU flags (later flags win in
    argparse). Readiness is a successful ``/health_generate`` (or ``/health``)
    answer. Raises ``RuntimeError`` with the log tail if the server exits
    early or is not ready within ``timeout`` seconds.
    """
    port = _free_port()
    command = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", HOST,
        "--port", str(port),
        *CPU_SERVER_FLAGS,
        *extra_args,
    ]  # fmt: skip
    log_file = tempfile.NamedTemporaryFile(
        prefix=f"sglang-{port}-", suffix=".log", delete=False
    )
    process = subprocess.Popen(
        command,
        env={**os.environ, **CPU_SERVER_ENV, **(env or {})},
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group, killed as a whole
    )
    log_file.close()
    handle = ServerHandle(f"http://{HOST}:{port}", process, Path(log_file.name))
    try:
        _wait_until_ready(handle, timeout)
    except BaseException:
        handle.close()
        raise
    return handle


def generate(
    base_url: str,
    prompts_or_input_ids: Sequence[str | Sequence[int]],
    sampling_params: Mapping[str, Any],
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """POST every prompt to ``/generate`` concurrently; responses in input order.

    Each item is either prompt text or a list of input token ids. Sending
    them concurrently lets the server batch them together.
    """

    def one(prompt: str | Sequence[int]) -> dict[str, Any]:
        payload: dict[str, Any] = (
            {"text": prompt} if isinstance(prompt, str) else {"input_ids": list(prompt)}
        )
        payload["sampling_params"] = dict(sampling_params)
        response = requests.post(f"{base_url}/generate", json=payload, timeout=timeout)
        response.raise_for_status()
        return response.json()

    if not prompts_or_input_ids:
        return []
    with ThreadPoolExecutor(max_workers=len(prompts_or_input_ids)) as pool:
        return list(pool.map(one, prompts_or_input_ids))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _wait_until_ready(handle: ServerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(
                f"server exited with code {handle.process.returncode}; "
                f"log tail:\n{handle.log_tail()}"
            )
        if _answers_health_check(handle.base_url):
            return
        time.sleep(1.0)
    raise RuntimeError(
        f"server not ready after {timeout:.0f}s; log tail:\n{handle.log_tail()}"
    )


def _answers_health_check(base_url: str) -> bool:
    """True once ``/health_generate`` succeeds (``/health`` if the former is absent)."""
    for path in ("/health_generate", "/health"):
        try:
            response = requests.get(base_url + path, timeout=30)
        except requests.RequestException:
            return False
        if response.status_code != 404:
            return response.ok
    return False


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process, its process group and any descendants that left it."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()
    psutil.wait_procs(descendants, timeout=10)
