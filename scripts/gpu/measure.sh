#!/usr/bin/env bash
# Every GPU measurement of the project in four back-to-back device calls on a machine
# with two GPUs (nvidia-h200-x2). Work that outlives a call runs in its own process
# session and keeps going while the machine stays warm (30 s between calls); each
# call leaves everything measured so far in $OUT/results.tgz.
#
#   call  carry                                              what runs
#   1     .bundle/sglang-gpu.tar.xz .bundle/gguf/part-00     install; soak (GPU 1, background, 8 min);
#         .bundle/gguf/SHA256                                TP=2 tests; A/B --quick at TP=2 (tiny pair)
#   2     .bundle/gguf/part-01                               receive the second GGUF part
#   3     .bundle/gguf/part-02                               background: build the cost-faithful pair (GPU 0),
#                                                            profile costs (GPU 1), A/B on both GPUs;
#                                                            foreground: single-GPU tests (GPU 0)
#   4     -                                                  wait for the A/B, collect
#
#   FASER_COMMIT=<sha> bash scripts/gpu/measure.sh 1|2|3|4
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
RES=/tmp/faser-results
TINY=/tmp/faser-tiny
MODELS=/tmp/faser-models
mkdir -p "$OUT" "$RES"
log() { echo "[measure $(date -u +%T)] $*" | tee -a "$RES/measure.log"; }
collect() { tar czf "$OUT/results.tgz" -C "$RES" . && log "collected: $(du -sh "$RES" | cut -f1)"; }
background() {  # background NAME CMD...: survives the end of this call
  setsid nohup bash -c "$*" >"$RES/$1.log" 2>&1 </dev/null &
}
SERVER_FLAGS="--attention-backend flashinfer --dtype bfloat16 --cuda-graph-backend-prefill disabled"
TINY_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 64 --mem-fraction-static 0.3 --max-total-tokens 200000"
BIG_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 64 --max-running-requests 64 --max-total-tokens 400000 --mem-fraction-static 0.8"
export FASER_GPU_RESULTS=$RES/gpu_results.jsonl

case ${1:?call: 1|2|3|4} in
  1)
    { echo "commit: ${FASER_COMMIT:-unknown}  date: $(date -u +%FT%TZ)"
      nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; } | tee "$RES/run-info.txt"
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log"
    python3 scripts/build_models.py tiny $TINY/target >/dev/null
    python3 scripts/build_models.py perturb $TINY/target $TINY/draft --noise 0.05 --seed 2 >/dev/null
    log "soak: 8 min on GPU 1 (background)"
    background soak CUDA_VISIBLE_DEVICES=1 python3 -m faser_sglang.bench.soak --target $TINY/target \
      --draft $TINY/draft --out $RES/soak --duration 480 --rate 8 --peak-to-valley 10 --abort-fraction 0.1 \
      --k-max 5 --server-args $TINY_FLAGS
    log "TP=2 tests"
    python3 -m pytest -p no:cacheprovider tests/gpu -m gpu -q -k tp2 2>&1 | tee "$RES/gpu_tests_tp2.log" | tail -5
    log "A/B --quick at TP=2 (tiny pair)"
    python3 -m faser_sglang.bench.ab --target $TINY/target --draft $TINY/draft --out $RES/ab-tp2-tiny \
      --contenders no-spec standalone-k3 faser --k-max 4 --max-new-tokens 128 --rate 8 --peak-to-valley 10 \
      --duration 40 --burst-min 5 --burst-max 15 --server-args $TINY_FLAGS --tp 2 2>&1 | grep "^\[ab\]\|^|"
    collect ;;
  2)
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log"
    collect ;;
  3)
    eval "$(bash scripts/gpu/stage_gguf.sh --receive | tail -1)"
    [[ -n ${FASER_SMOLLM2_GGUF:-} ]] || { log "GGUF incomplete"; exit 1; }
    echo "{\"policy\": \"adaptive\", \"cost_model_path\": \"$RES/costs.json\"}" > $RES/faser-ad.json
    log "background: build pair (GPU 0) -> profile (GPU 1) -> A/B (GPUs 0, 1)"
    background big "set -eo pipefail
      export FASER_SMOLLM2_GGUF=$FASER_SMOLLM2_GGUF
      CUDA_VISIBLE_DEVICES=0 python3 scripts/build_models.py pair $MODELS --preset cost-faithful \
        --distill-steps ${DISTILL_STEPS:-1000} 2>&1 | tail -20
      cp $MODELS/pair.json $RES/
      CUDA_VISIBLE_DEVICES=1 python3 scripts/profile_costs.py --target $MODELS/target --draft $MODELS/draft \
        --out $RES/costs.json --k-max 7 --batch-sizes 1,2,4,8,16,32,64 --long-batch-sizes '' \
        --max-new-tokens 64 --server-args '$BIG_FLAGS' 2>&1 | grep -v '^\[20' | tail -20
      while [[ ! -f $RES/tests.done ]]; do sleep 2; done  # GPU 0 free of the tests before timing
      python3 -m faser_sglang.bench.ab --target $MODELS/target --draft $MODELS/draft --out $RES/ab \
        --gpus 0 1 --contenders no-spec standalone-k2 standalone-k4 standalone-k6 ngram faser faser-ad \
        --faser-ad-config $RES/faser-ad.json --workload humaneval --max-new-tokens 256 --k-max 7 \
        --rate ${RATE:-6} --peak-to-valley 20 --duration ${DURATION:-75} --burst-min 5 --burst-max 25 \
        --server-args $BIG_FLAGS 2>&1 | grep -v '^\[20'
      touch $RES/big.done"
    log "single-GPU tests (GPU 0)"
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -p no:cacheprovider tests/gpu -m gpu -q -k "not tp2" 2>&1 \
      | tee "$RES/gpu_tests.log" | tail -5
    touch $RES/tests.done
    collect ;;
  4)
    for _ in $(seq 1 110); do [[ -f $RES/big.done ]] && break; sleep 5; done
    tail -40 "$RES/big.log"
    [[ -f $RES/big.done ]] || log "A/B still running (collecting what exists)"
    collect ;;
esac
