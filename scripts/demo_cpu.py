"""The main job on a small default, on CPU: A/B FASER against SGLang's built-in
speculation through real servers (the CPU test harness runs SGLang here).

    python scripts/demo_cpu.py [--out artifacts/demo] [--prompts 8] [--max-new-tokens 48]

Builds a tiny target and a noisy-copy draft (seconds, no downloads), then runs
faser_sglang.bench.quick with no-spec, STANDALONE (k=3) and FASER contenders.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import build_tiny_models  # noqa: E402
from server_utils import CPU_SERVER_ENV, CPU_SERVER_FLAGS  # noqa: E402

from faser_sglang.bench import quick  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "artifacts" / "demo")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    models = build_tiny_models(args.out / "models")
    os.environ.update(CPU_SERVER_ENV)
    result_path = args.out / "quick.json"
    quick.main(
        [
            "--target", str(models.target),
            "--draft", str(models.draft),
            "--k-max", "4",
            "--contenders", "no-spec", "standalone-k3", "faser",
            "--concurrency", "1", "8",
            "--num-prompts", str(args.prompts),
            "--max-new-tokens", str(args.max_new_tokens),
            "--prompts", "humaneval",
            "--out", str(result_path),
            "--server-args", *CPU_SERVER_FLAGS,
        ]
    )  # fmt: skip
    mismatches = json.loads(result_path.read_text())["greedy_mismatches_vs_first"]
    faser_ok = all(v == 0 for v in mismatches["faser"].values())
    print(f"FASER greedy output identical to no-spec: {faser_ok}  (results: {result_path})")
    return 0 if faser_ok else 1


if __name__ == "__main__":
    sys.exit(main())
