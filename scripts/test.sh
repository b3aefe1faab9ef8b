#!/usr/bin/env bash
# The test command: install the CPU environment if needed, then run every CPU test
# (GPU tests skip themselves without CUDA; run them with scripts/gpu/run_gpu_tests.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# Servers started by tests must not outlive a killed run.
trap 'pkill -f "sglang.launch_server" 2>/dev/null || true' EXIT
python -m pytest -q -p no:cacheprovider --timeout 1800 "$@"
