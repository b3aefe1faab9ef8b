"""The GPU scripts parse, on CPU: a syntax error found only on the GPU machine costs a
device call. measure.sh builds its A/B stage as a command string for a background
shell, which ``bash -n`` on the file does not read; the stage's builders are checked
by parsing what they print."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
MEASURE = SCRIPTS / "gpu" / "measure.sh"


@pytest.mark.parametrize("script", sorted(SCRIPTS.rglob("*.sh")), ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_shell_script_parses(script: Path):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _builders() -> str:
    """measure.sh's ab_cmd and ab_diagnosed definitions (each ends at a line '}')."""
    text = MEASURE.read_text()
    found = [re.search(rf"^{name}\(\) {{.*?^}}$", text, re.S | re.M) for name in ("ab_cmd", "ab_diagnosed")]
    assert all(found), "ab_cmd / ab_diagnosed not found in measure.sh"
    return "\n".join(m.group(0) for m in found)


@pytest.mark.parametrize(
    "call, settings",
    [
        ("ab_diagnosed /tmp/faser-models", "SCHED_TIMELINE=1 SPY=1"),  # call 3
        ('ab_diagnosed /tmp/faser-tiny "$TINY_FLAGS" 64', "SWEEP_RATES=''"),  # tiny-ab
        ("ab_cmd /tmp/faser-models", "CONTENDERS='no-spec faser-ad@draft_ahead=true+x=y'"),  # stage ab
    ],
)
def test_measure_ab_stage_builds_a_valid_script(call: str, settings: str, tmp_path: Path):
    setup = (
        f"RES={tmp_path} NUM_GPUS=1 BIG_FLAGS='--big' TINY_FLAGS='--attention-backend flashinfer --dtype bfloat16' "
        f"{settings}"
    )
    built = subprocess.run(
        ["bash", "-c", f"set -u; {setup}; {_builders()}\n{call}"], capture_output=True, text=True, check=True
    ).stdout
    assert "python3 -m faser_sglang.bench.ab --target /tmp/faser-" in built
    parsed = subprocess.run(["bash", "-n"], input=built, capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr + built
