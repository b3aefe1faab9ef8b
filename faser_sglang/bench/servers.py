"""Start SGLang servers (one per contender) and stop them cleanly.

Every contender is the stock ``python -m sglang.launch_server`` with the same target
model and different speculative flags, bound to a free loopback port. The launcher
waits for ``/health_generate`` and kills the whole process tree on close, so
contenders can run one after another on one GPU inside one job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Mapping, Sequence

import psutil
import requests

from faser_sglang.config import FaserConfig

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Contender:
    """One way of serving the target: a name, extra launcher flags and env."""

    name: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


# No-spec served a second time: under a dynamic trace the batches differ between runs
# and bf16 GPU decoding is not batch-invariant, so greedy outputs can differ from
# no-spec's without any speculation; this contender measures how often.
CONTROL = "no-spec-control"


def no_spec() -> Contender:
    return Contender("no-spec")


def standalone(draft: str, k: int) -> Contender:
    return Contender(
        f"standalone-k{k}",
        (
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(k),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1),
        ),
    )  # fmt: skip


def ngram(k: int = 4) -> Contender:
    return Contender("ngram", ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k + 1)))


def faser(draft: str, k_max: int, config_path: str | None = None, name: str = "faser") -> Contender:
    env = {"FASER_CONFIG": config_path} if config_path else {}
    return Contender(
        name,
        (
            "--speculative-algorithm", "FASER",
            "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(k_max),
        ),
        env,
    )  # fmt: skip


def contender(
    name: str, draft: str, k_max: int, faser_config: str | None = None, faser_ad_config: str | None = None
) -> Contender:
    """A contender by its benchmark name: no-spec, no-spec-control (no-spec served
    again, for the run-to-run noise floor), standalone-k<K>, ngram, faser, faser-ad
    (FASER with the adaptive policy's config), faser-ad-sync (the same on SGLang's
    synchronous schedule, ``--disable-overlap-schedule``) or a faser-ad variant,
    ``faser-ad@KEY=VALUE[,KEY=VALUE...]``: the faser-ad config with those keys
    replaced (``variant_config``), so one run can A/B a FASER setting side by side.
    Any of them may end in server flags of its own, ``+FLAG[=VALUE]`` each, and
    environment variables, ``+env:NAME=VALUE`` each (``with_flags``)."""
    base, flags = split_flags(name)
    if flags:
        return with_flags(name, contender(base, draft, k_max, faser_config, faser_ad_config), flags)
    if name == "no-spec":
        return no_spec()
    if name == CONTROL:
        return Contender(CONTROL)
    if name.startswith("standalone-k"):
        return standalone(draft, int(name.removeprefix("standalone-k")))
    if name == "ngram":
        return ngram()
    if name == "faser":
        return faser(draft, k_max, faser_config)
    base, _, overrides = name.partition(VARIANT_SEP)
    if base in ("faser-ad", "faser-ad-sync"):
        if faser_ad_config is None:
            raise ValueError(f"contender {name} needs a FASER_CONFIG file with policy 'adaptive' (--faser-ad-config)")
        config = variant_config(faser_ad_config, name, overrides) if overrides else faser_ad_config
        c = faser(draft, k_max, config, name=name)
        return Contender(name, (*c.args, "--disable-overlap-schedule") if base == "faser-ad-sync" else c.args, c.env)
    raise ValueError(f"unknown contender {name!r}")


VARIANT_SEP = "@"
FLAG_SEP = "+"
ENV_PREFIX = "env:"


def split_flags(name: str) -> tuple[str, list[str]]:
    """A contender name's base and its server flags: "faser-ad+speculative-draft-attention-backend=triton"
    -> ("faser-ad", ["speculative-draft-attention-backend=triton"])."""
    base, *flags = name.split(FLAG_SEP)
    return base, flags


def with_flags(name: str, base: Contender, flags: Sequence[str]) -> Contender:
    """``base`` served with extra launcher flags, "FLAG=VALUE" -> --FLAG VALUE and
    "FLAG" -> --FLAG, after its own (SGLang takes the last value of a repeated flag),
    and environment variables, "env:NAME=VALUE" (e.g. no-spec+env:FASER_HOST_PREFILL_PLAN=1),
    under the full ``name``."""
    args: list[str] = []
    env = dict(base.env)
    for flag in flags:
        if flag.startswith(ENV_PREFIX):
            key, eq, value = flag.removeprefix(ENV_PREFIX).partition("=")
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) or not eq:
                raise ValueError(
                    f"contender {name!r}: {flag!r} is not env:NAME=VALUE (e.g. env:FASER_HOST_PREFILL_PLAN=1)"
                )
            env[key] = value
            continue
        key, eq, value = flag.partition("=")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key) or (eq and not value):
            raise ValueError(
                f"contender {name!r}: {flag!r} is not a server flag FLAG or FLAG=VALUE "
                "(e.g. faser-ad+speculative-draft-attention-backend=triton)"
            )
        args.extend((f"--{key}", value) if eq else (f"--{key}",))
    return Contender(name, (*base.args, *args), env)


def steady_contender(
    name: str, draft: str, k_max: int, config_dir: Path, faser_ad_config: str | None = None, greedy: bool = False
) -> Contender:
    """A contender for measuring steps at a steady batch (scripts/profile_host.py,
    scripts/profile_step.py): any ``contender`` name, or
    - ``no-spec-sync``: no-spec on SGLang's synchronous loop (--disable-overlap-schedule);
    - ``faser-k0`` / ``faser-k0-sync``: FASER whose policy never drafts, every step a
      plain decode through the FASER worker (its gap to no-spec is the worker's own
      overhead), on the overlap or the synchronous loop;
    - ``faser-k<K>[@KEY=VALUE,...]``: policy ``fixed``, every request drafts K tokens
      every step (the drafting path), with those config keys replaced.
    Configs these need are written to ``config_dir``; with ``greedy`` (no request
    samples) they turn ``sampled_chain`` off, so the server skips capturing graphs no
    step replays (tens of seconds and GiBs on a large draft). Server flags end any of
    them as in ``contender``."""
    base, flags = split_flags(name)
    if flags:
        return with_flags(name, steady_contender(base, draft, k_max, config_dir, faser_ad_config, greedy), flags)
    greedy_only = {"sampled_chain": False} if greedy else {}
    if name == "no-spec-sync":
        return Contender(name, ("--disable-overlap-schedule",))
    if name in ("faser-k0", "faser-k0-sync"):
        # ema: k_i = largest k with rate**k >= min_token_value; 0.999 keeps every k_i at 0.
        config = config_dir / "faser-k0.json"
        config.write_text(json.dumps({"policy": "ema", "min_token_value": 0.999, **greedy_only}))
        c = faser(draft, k_max, str(config), name=name)
        sync = ("--disable-overlap-schedule",) if name == "faser-k0-sync" else ()
        return Contender(name, (*c.args, *sync), c.env)
    base, _, overrides = name.partition(VARIANT_SEP)
    if re.fullmatch(r"faser-k[1-9]\d*", base):
        config = config_dir / f"{base}.json"
        config.write_text(json.dumps({"policy": "fixed", **greedy_only}))
        path = variant_config(str(config), name, overrides) if overrides else str(config)
        return faser(draft, int(base.removeprefix("faser-k")), path, name=name)
    return contender(name, draft, k_max, faser_ad_config=faser_ad_config)


def variant_config(base_path: str, name: str, overrides: str) -> str:
    """Write the config of variant ``name`` beside ``base_path``: the base config (JSON)
    with ``overrides`` ("KEY=VALUE[,KEY=VALUE...]", each VALUE JSON or else a string)
    applied, checked as a FASER config so that a typo fails before any server starts.
    Returns the new file's path."""
    try:
        data = json.loads(Path(base_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"contender {name!r}: cannot read the faser-ad config {base_path} ({e})") from None
    for item in overrides.split(","):
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ValueError(f"contender {name!r}: {item!r} is not KEY=VALUE (e.g. faser-ad@draft_prefill=eager)")
        try:
            data[key] = json.loads(raw)
        except json.JSONDecodeError:
            data[key] = raw
    FaserConfig.from_mapping(data, source=f"contender {name!r}")
    path = Path(base_path).with_name(f"{name}.json")
    path.write_text(json.dumps(data))
    return str(path)


@dataclass
class Server:
    """A running server; closing kills its process tree."""

    base_url: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, num_chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def close(self) -> None:
        kill_tree(self.process)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class DecodeLogLine:
    """One of SGLang's "Decode batch" log lines (one per --decode-log-interval decode steps)."""

    running: int  # requests in the batch
    accept_len: float | None  # tokens per request and step; None without speculation
    throughput: float  # generated tokens/s since the previous line


_DECODE_LINE = re.compile(
    r"Decode batch, #running-req: (\d+),(?:.*?accept len: ([\d.]+),)?.*?gen throughput \(token/s\): ([\d.]+)"
)


def decode_log_lines(text: str) -> list[DecodeLogLine]:
    """The decode log lines in a server's log ``text``, in order."""
    return [
        DecodeLogLine(int(m[1]), float(m[2]) if m[2] else None, float(m[3])) for m in _DECODE_LINE.finditer(text)
    ]


# Free ports are picked, released, then bound by the server: another process starting
# at the same time (a second server's internal ports) can take one in between.
PORT_ATTEMPTS = 3
PORT_IN_USE = "address already in use"


class PortInUse(RuntimeError):
    """The server could not bind a port it was given; a launch on fresh ports may work."""


def launch(
    model_path: str | os.PathLike[str],
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    log_dir: str | os.PathLike[str] | None = None,
) -> Server:
    """Start ``sglang.launch_server`` on a free port and wait until it generates; on a
    port taken in between, again on another (PORT_ATTEMPTS in all).

    Raises RuntimeError with the log tail if it exits or is not ready in time.
    """
    attempt = 1
    while True:
        server = _start(model_path, args, env, log_dir)
        try:
            _wait_ready(server, timeout)
            return server
        except PortInUse:
            server.close()
            if attempt == PORT_ATTEMPTS:
                raise
            attempt += 1
        except BaseException:
            server.close()
            raise


def _start(
    model_path: str | os.PathLike[str],
    args: Sequence[str],
    env: Mapping[str, str] | None,
    log_dir: str | os.PathLike[str] | None,
) -> Server:
    port = free_port()
    command = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", HOST,
        "--port", str(port),
        *args,
    ]  # fmt: skip
    log = tempfile.NamedTemporaryFile(
        prefix=f"sglang-{port}-", suffix=".log", delete=False, dir=log_dir
    )
    process = subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group, killed as a whole
    )
    log.close()
    return Server(f"http://{HOST}:{port}", process, Path(log.name))


def flush_cache(base_url: str, wait: float = 60.0) -> None:
    """Empty the server's radix cache (waits up to ``wait`` s for it to go idle)."""
    r = requests.post(f"{base_url}/flush_cache", params={"timeout": wait}, timeout=wait + 30)
    if not r.ok:
        raise RuntimeError(f"{base_url}/flush_cache: HTTP {r.status_code}: {r.text.strip()}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A server that cannot bind its HTTP port logs it and keeps running, unready.
        tail = server.log_tail()
        if PORT_IN_USE in tail:
            raise PortInUse(f"server could not bind a port; log tail:\n{tail}")
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with code {server.process.returncode}; log tail:\n{server.log_tail()}"
            )
        try:
            if requests.get(server.base_url + "/health_generate", timeout=30).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"server not ready after {timeout:.0f}s; log tail:\n{server.log_tail()}")


def kill_tree(process: subprocess.Popen) -> None:
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
