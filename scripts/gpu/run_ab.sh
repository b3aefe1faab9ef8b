#!/usr/bin/env bash
# On the GPU machine: the FASER measurements, in device calls of <= 10 minutes that
# share /tmp while the machine stays warm. Stages, in order:
#
#   stage   carry                                   what it does
#   parts   .bundle/sglang-gpu.tar.xz .bundle/gguf   install bundle; receive GGUF parts
#           (part-03 with the bundle, then part-00+01, then part-02: <= 64 MiB per call)
#   models  -                                        build the cost-faithful pair (SmolLM2
#                                                    widened to 7.2B-class + distilled 0.4B draft)
#   ab      -                                        A/B: no-spec / STANDALONE k=1,3,5,7 / NGRAM / FASER
#   quick   -                                        A/B --quick (no-spec, standalone-k3, faser)
#   profile -                                        cost-model profile for the adaptive policy
#
#   FASER_COMMIT=<sha> bash scripts/gpu/run_ab.sh <stage>     # results under $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
MODELS=/tmp/faser-models
echo "commit: ${FASER_COMMIT:-unknown}  date: $(date -u +%FT%TZ)" | tee "$OUT/run-info.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/run-info.txt"
SERVER_ARGS=(
  --attention-backend flashinfer --dtype bfloat16
  --cuda-graph-backend-prefill disabled --cuda-graph-max-bs 64
  --max-running-requests 64 --max-total-tokens 400000 --mem-fraction-static 0.8
)
case ${1:?stage: parts|models|ab|quick|profile} in
  parts)
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$OUT/run-info.txt" ;;
  models)
    eval "$(bash scripts/gpu/stage_gguf.sh --receive | tail -1)"
    python3 scripts/build_models.py pair "$MODELS" --preset cost-faithful ${DISTILL_STEPS:+--distill-steps $DISTILL_STEPS} 2>&1 | tail -20
    cp "$MODELS/pair.json" "$OUT/" ;;
  ab|quick)
    PAIR=$(python3 -c "import json; p=json.load(open('$MODELS/pair.json')); print(p['target'], p['draft'])")
    read -r TARGET DRAFT <<<"$PAIR"
    EXTRA=(); [[ $1 == quick ]] && EXTRA=(--quick)
    python3 -m faser_sglang.bench.ab --target "$TARGET" --draft "$DRAFT" --out "$OUT/ab" \
      --workload humaneval --max-new-tokens 256 --rate ${RATE:-6} --peak-to-valley 20 \
      --duration ${DURATION:-120} --burst-min 5 --burst-max 30 --k-max 7 "${EXTRA[@]}" \
      --server-args "${SERVER_ARGS[@]}" 2>&1 | grep -v "^\[20" | tail -40 ;;
  profile)
    PAIR=$(python3 -c "import json; p=json.load(open('$MODELS/pair.json')); print(p['target'], p['draft'])")
    read -r TARGET DRAFT <<<"$PAIR"
    python3 scripts/profile_costs.py --target "$TARGET" --draft "$DRAFT" --out "$OUT/costs.json" 2>&1 | tail -20 ;;
esac
