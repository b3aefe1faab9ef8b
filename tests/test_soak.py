"""The soak tool end to end on CPU: a short bursty run with aborts and mixed sampling
must finish with no crash, no failed request and every KV slot back."""

from __future__ import annotations

import json

import pytest

from faser_sglang.bench import soak
from server_utils import CPU_SERVER_FLAGS

pytestmark = pytest.mark.server


def test_short_soak_passes_and_writes_its_reports(tiny_models, tmp_path, cpu_server_env):
    out = tmp_path / "soak"
    rc = soak.main(
        [
            "--target", str(tiny_models.target), "--draft", str(tiny_models.draft), "--out", str(out),
            "--duration", "15", "--rate", "1.5", "--peak-to-valley", "4", "--burst-min", "3", "--burst-max", "6",
            "--abort-fraction", "0.3", "--k-max", "4", "--seed", "1",
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    report = json.loads((out / "soak.json").read_text())
    verdict = report["verdict"]
    assert rc == 0, verdict
    assert verdict["passed"] and verdict["used_tokens_after"] == verdict["used_tokens_before"] == 0
    assert verdict["aborted"] > 0 and verdict["ok"] > 0
    assert sum(r["abort"] is not None for r in report["requests"]) == verdict["aborted"] + sum(
        r["status"] == "ok" and r["abort"] is not None for r in report["requests"]
    )
    assert (out / "soak.md").read_text().startswith("| minute |")
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
