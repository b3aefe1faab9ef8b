#!/usr/bin/env bash
# On the GPU machine: install the pinned SGLang bundle and this package, check
# imports, run the GPU tests, and leave logs + results under $OUT (or ./gpu-out).
#
#   bash scripts/gpu/run_gpu_tests.sh            # all GPU tests
#   bash scripts/gpu/run_gpu_tests.sh -k "triton and graphs"   # extra pytest args
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export FASER_GPU_RESULTS=$OUT/gpu_results.jsonl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "commit: ${FASER_COMMIT:-unknown (set FASER_COMMIT)}" | tee -a "$OUT/device.txt"
python3 scripts/gpu/check_imports.py | tail -3
python3 -m pytest -p no:cacheprovider tests/gpu -m gpu -x -q "$@" 2>&1 | tee "$OUT/gpu_tests.log"
