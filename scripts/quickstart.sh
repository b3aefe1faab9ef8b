#!/usr/bin/env bash
# One command on a fresh CPU machine: install everything (.venv), then run the main
# job on a small default: no-spec vs STANDALONE vs FASER through real SGLang servers
# on HumanEval prompts, checking greedy outputs are identical and reporting accepted
# lengths and throughput ratios (CPU timings are indicative only; see README for GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
# shellcheck disable=SC1091
. .venv/bin/activate
trap 'pkill -f "sglang.launch_server" 2>/dev/null || true' EXIT
python scripts/demo_cpu.py "$@"
