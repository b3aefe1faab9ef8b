"""scripts/gpu/graph_launch.py's report (its measurements need a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu"


def load(monkeypatch):
    """The script as run (``python3 scripts/gpu/graph_launch.py``: its folder on the path)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("graph_launch", SCRIPTS / "graph_launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_gives_each_condition_per_launch_and_per_node(monkeypatch):
    script = load(monkeypatch)
    rows = [
        {"shape": "line", "nodes": 256, "node_types": {"kernel": 256},
         "idle": 512.0, "busy": 640.0, "profiled": 1024.0},
        {"shape": "fork", "nodes": 64, "node_types": None, "idle": 32.0, "busy": 32.0, "profiled": 64.0},
    ]
    lines = script.table(rows).splitlines()
    assert lines[0] == (
        "| shape | nodes | idle us (per node) | busy us (per node) | profiled us (per node) | node types |"
    )
    assert lines[2] == "| line | 256 | 512 (2.00) | 640 (2.50) | 1024 (4.00) | kernel 256 |"
    assert lines[3] == "| fork | 64 | 32 (0.50) | 32 (0.50) | 64 (1.00) | - |"
