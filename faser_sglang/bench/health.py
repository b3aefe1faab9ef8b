"""A server's load and leak check: how many requests run and wait, how many KV
slots are in use, and waiting until a drained server holds no slot at all.

The FASER draft shares the target's request-to-token map and slot allocator, so a
slot leaked by either model shows up in SGLang's own accounting (``/v1/loads``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests


@dataclass(frozen=True)
class Load:
    """The scheduler-side numbers of ``/v1/loads``, summed over DP ranks."""

    running: int
    waiting: int
    used_tokens: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


def load(base_url: str) -> Load:
    """The server's current load (``/v1/loads``)."""
    loads = requests.get(f"{base_url}/v1/loads", timeout=60).json()["loads"]
    return Load(
        running=sum(r["num_running_reqs"] for r in loads),
        waiting=sum(r["num_waiting_reqs"] for r in loads),
        used_tokens=sum(r["num_used_tokens"] for r in loads),
    )


def wait_until_drained(base_url: str, timeout: float = 120.0) -> Load:
    """Wait until no request runs or waits, then flush the radix cache and wait
    until every KV slot is free. Returns the last load seen; the caller asserts on
    it (a request stuck in the scheduler or a leaked slot never reaches zero)."""
    deadline = time.monotonic() + timeout
    current = load(base_url)
    while not current.idle and time.monotonic() < deadline:
        time.sleep(0.5)
        current = load(base_url)
    if not current.idle:
        return current
    while time.monotonic() < deadline:
        requests.post(f"{base_url}/flush_cache", timeout=60)
        current = load(base_url)
        if current.used_tokens == 0:
            break
        time.sleep(0.5)
    return current
