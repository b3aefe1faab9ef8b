#!/usr/bin/env bash
# Create .venv with real SGLang 0.5.17 for CPU (lean: no CUDA-only wheels), this
# package and the CPU test harness. Idempotent: skips when the requirements are
# unchanged since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
STAMP=.venv/.faser-requirements.sha256
WANT=$(cat requirements/cpu.txt requirements/nodeps.txt pyproject.toml tests/cpu_harness/pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup_cpu: .venv is up to date"
  exit 0
fi
python -m pip install -q --upgrade pip wheel setuptools
python -m pip install -q -r requirements/cpu.txt
python -m pip install -q --no-deps -r requirements/nodeps.txt
python -m pip install -q --no-deps -e . -e tests/cpu_harness
echo "$WANT" > "$STAMP"
echo "setup_cpu: installed into .venv"
