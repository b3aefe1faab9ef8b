"""The step profile on a real CUDA trace (scripts/gpu/check_step_profile.py): kernel and
graph launches, device time matched by correlation, waits, the device's busy time."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "check_step_profile.py"


def test_step_profile_reads_a_cuda_trace(tmp_path):
    spec = importlib.util.spec_from_file_location("check_step_profile", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = check
    spec.loader.exec_module(check)
    results = check.checks(check.profile_steps(tmp_path))
    assert all(results.values()), [name for name, ok in results.items() if not ok]
