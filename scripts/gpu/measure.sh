#!/usr/bin/env bash
# Every GPU measurement of the project in four back-to-back device calls on a machine
# with two GPUs (nvidia-h200-x2). Work that outlives a call runs in its own process
# session and keeps going while the machine stays warm (30 s between calls); each
# call leaves everything measured so far in $OUT/results.tgz.
#
#   call  carry                                              what runs
#   1     .bundle/sglang-gpu.tar.xz .bundle/gguf/part-00     install; background: soak (GPU 1, 8 min; two GPUs only)
#         .bundle/gguf/SHA256
#   2     .bundle/gguf/part-01                               receive the second GGUF part
#   3     .bundle/gguf/part-02                               background: build the cost-faithful pair and
#                                                            profile its costs (GPU 0); once the soak is
#                                                            done, the A/B on both GPUs (one lane each)
#   4     -                                                  wait for the A/B (at most WAIT s), collect
#
#   soak  (after call 1)                                     the soak alone (one-GPU machines)
# On one GPU the A/B contenders run one after another. The GPU tests (single GPU and
# TP=2) are scripts/gpu/run_gpu_tests.sh.
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
  local name=$1; shift
  setsid nohup bash -c "$*" >"$RES/$name.log" 2>&1 </dev/null &
}
trap collect EXIT
SERVER_FLAGS="--attention-backend flashinfer --dtype bfloat16 --cuda-graph-backend-prefill disabled"
TINY_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 64 --mem-fraction-static 0.3 --max-total-tokens 200000"
BIG_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 64 --max-running-requests 64 --max-total-tokens 400000 --mem-fraction-static 0.8"
export FASER_GPU_RESULTS=$RES/gpu_results.jsonl
NUM_GPUS=$(nvidia-smi -L | wc -l)

case ${1:?call: 1|2|3|4} in
  1)
    { echo "commit: ${FASER_COMMIT:-unknown}  date: $(date -u +%FT%TZ)"
      nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; } | tee "$RES/run-info.txt"
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log"
    python3 scripts/build_models.py tiny $TINY/target >/dev/null
    python3 scripts/build_models.py perturb $TINY/target $TINY/draft --noise 0.05 --seed 2 >/dev/null
    if (( NUM_GPUS < 2 )); then
      log "one GPU: no background soak (it would share the GPU with the timing runs); run call 'soak'"
      exit 0
    fi
    log "background: soak, 8 min on GPU 1"
    touch $RES/soak.started
    background soak "CUDA_VISIBLE_DEVICES=1 python3 -m faser_sglang.bench.soak --target $TINY/target \
      --draft $TINY/draft --out $RES/soak --duration 480 --rate 8 --peak-to-valley 10 --abort-fraction 0.1 \
      --k-max 5 --server-args $TINY_FLAGS; touch $RES/soak.done" ;;
  2)
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log" ;;
  3)
    eval "$(bash scripts/gpu/stage_gguf.sh --receive | tail -1)"
    [[ -n ${FASER_SMOLLM2_GGUF:-} ]] || { log "GGUF incomplete"; exit 1; }
    echo "{\"policy\": \"adaptive\", \"cost_model_path\": \"$RES/costs.json\"}" > $RES/faser-ad.json
    LANES=; (( NUM_GPUS >= 2 )) && LANES="--gpus 0 1"
    log "background: build pair, profile (GPU 0); A/B (lanes: ${LANES:-one GPU})"
    background big "set -eo pipefail
      export FASER_SMOLLM2_GGUF=$FASER_SMOLLM2_GGUF
      CUDA_VISIBLE_DEVICES=0 python3 scripts/build_models.py pair $MODELS --preset cost-faithful \
        --distill-steps ${DISTILL_STEPS:-500} 2>&1 | tail -20
      cp $MODELS/pair.json $RES/
      CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_costs.py --target $MODELS/target --draft $MODELS/draft \
        --out $RES/costs.json --k-max 7 --batch-sizes 1,4,16,64 --long-batch-sizes '' \
        --max-new-tokens 48 --server-args '$BIG_FLAGS' 2>&1 | grep -v '^\[20' | tail -20
      while [[ -f $RES/soak.started && ! -f $RES/soak.done ]]; do sleep 2; done  # GPU 1 free before timing
      python3 -m faser_sglang.bench.ab --target $MODELS/target --draft $MODELS/draft --out $RES/ab \
        $LANES --contenders ${CONTENDERS:-no-spec faser-ad standalone-k2 faser standalone-k5} \
        --faser-ad-config $RES/faser-ad.json --workload humaneval --max-new-tokens 256 --k-max 7 \
        --rate ${RATE:-6} --peak-to-valley 20 --duration ${DURATION:-60} --burst-min 5 --burst-max 20 \
        --server-args $BIG_FLAGS 2>&1 | grep -v '^\[20'
      touch $RES/big.done" ;;
  soak)  # the soak alone, in the foreground (8 min; on a one-GPU machine)
    python3 scripts/build_models.py tiny $TINY/target >/dev/null
    python3 scripts/build_models.py perturb $TINY/target $TINY/draft --noise 0.05 --seed 2 >/dev/null
    python3 -m faser_sglang.bench.soak --target $TINY/target --draft $TINY/draft --out $RES/soak \
      --duration 480 --rate 8 --peak-to-valley 10 --abort-fraction 0.1 --k-max 5 --server-args $TINY_FLAGS \
      2>&1 | grep -v '^\[20' | tail -20 ;;
  4)
    # Wait for the A/B, at most $WAIT seconds (the call's limit is 600).
    for _ in $(seq 1 $((${WAIT:-540} / 5))); do [[ -f $RES/big.done ]] && break; sleep 5; done
    tail -30 "$RES/big.log"; tail -3 "$RES/soak.log"
    [[ -f $RES/big.done ]] || log "A/B still running (collecting what exists)" ;;
esac
