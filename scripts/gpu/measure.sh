#!/usr/bin/env bash
# Every GPU measurement of the project in four back-to-back device calls on a machine
# with two GPUs (nvidia-h200-x2). The GGUF parts each call carries are those
# scripts/gpu/stage_gguf.sh prints (part-00 only while the checkout leaves room beside
# the bundle; a fourth part goes in a "stage" call between calls 2 and 3). Work that
# outlives a call runs in its own process session and keeps going while the machine
# stays warm (30 s between calls); each call leaves everything measured so far in
# $OUT/results.tgz.
#
#   call  carry                                              what runs
#   1     .bundle/sglang-gpu.tar.xz .bundle/gguf/part-00     install; time graph launches; background: kernel warm-up and
#         .bundle/gguf/SHA256                                the single-GPU tests (GPU 0) and, on GPU 1, the differential
#                                                            fuzzer (GPU1_JOB=fuzz, default; FUZZ_SEEDS x
#                                                            FUZZ_CASES) or the 8-minute soak (GPU1_JOB=soak)
#   2     .bundle/gguf/part-01                               receive the second GGUF part; time the
#                                                            allocator on this host's CPU
#   3     .bundle/gguf/ the last part (part-02 or -03)       background "big": build the cost-faithful
#                                                            pair (GPU 0; on one GPU once call 1's tests
#                                                            are done); profile its costs once the tests
#                                                            are done; the bursty A/B (one lane per GPU)
#                                                            once GPU 1 is free, each contender's server
#                                                            then replaying Poisson at SWEEP_RATES (rate
#                                                            sweep); then the TP=2 tests and TP=2 A/B.
#                                                            COSTS=<file>: use that cost profile of the
#                                                            same (seeded) pair instead of profiling
#   4     -                                                  wait for "big" (at most WAIT s), collect;
#                                                            repeat while it runs
#   ab    (after call 3)                                     the A/B stage again with other settings
#         (AB_MODELS=/tmp/faser-deep: after twins-ab)      (SCHED_TIMELINE, SPY) on the pair, or on the twins
#
#   soak  (after call 1)                                     the soak alone (one-GPU machines)
#   stage (any call carrying a GGUF part)                    install, receive the part
#   draft (after the GGUF is complete)                       distil the preset's draft alone, report its
#                                                            agreement (pair.json; ~5 min, no widening)
#   host  (any time)                                         per-step host cost of every contender on the
#                                                            tiny pair (scripts/profile_host.py; GPU 0)
#   host-wait                                                wait for "host" (at most WAIT s)
#   period (after call 1)                                    decode step period of each contender (CONTENDERS,
#                                                            HOST_CONCURRENCY) on full-depth shape twins of the
#                                                            preset: the pair's forward costs, every draft
#                                                            accepted, no GGUF (scripts/profile_host.py; GPU 0)
#                                                            PERIOD_MAX_BS (default 64) caps the running
#                                                            requests and the decode graphs, so the verify's
#                                                            token budget: 64 - C drafts per step at C requests
#   period-wait                                              wait for "period" (at most WAIT s)
#   tiny-ab (any time, one call)                            h2d-sync.md, TESTS_K, then the bursty A/B (CONTENDERS,
#                                                            SCHED_TIMELINE, SPY) on the tiny pair, 64 new tokens
#   twins-ab (after call 1 or on a fresh machine)           the bursty A/B (CONTENDERS, SCHED_TIMELINE, SPY) on
#                                                            those twins, no GGUF, FASER-AD on the analytical
#                                                            cost model; first h2d-sync.md, then in the background
#                                                            (on a fresh machine the GPU tests TESTS_K,)
#                                                            prefill-plan.md and the A/B. Call 4 waits more
# On one GPU the tests run in the background of call 1 (TESTS_K selects them, e.g.
# TESTS_K=gpu_fuzz for the fuzzer alone; TESTS_K=skip runs none, so call 3's pair build,
# which waits for them, starts at once), the A/B contenders one after another, and
# the GPU-1 job and TP=2 runs are left out. Where a GPU machine is available for about
# 30 minutes at a time, with the 13.5B pair (built and distilled in about 6-7 min of
# call 3, each contender 2.7-4.3 min from start to its trace's end) that is three to
# four contenders after call 1's install; list the ones that matter first, since a run
# cut short keeps only what finished.
#
# SWEEP_RATES="" leaves the rate sweep out. RATE sets the bursty trace's mean request rate
# (default 6). AB_TEMPERATURE=0.8 has every A/B request sample (top-p 0.95) instead of
# decoding greedily. AD_TRACE=1 has FASER-AD trace its decode steps and checks them against the
# cost model after the A/B (scripts/check_costs.py: check-costs.md, faser-ad-steps.csv).
# LAZY_PROFILE=<batch sizes, e.g. 1,4,16,64,1,4,16,64> adds, after the A/B, a profile with
# lazy draft prefill (16-token requests, so many steps pay a prompt-long catch-up) whose
# per-step trace stays in profile-lazy/.
# SPY=1 has py-spy sample every A/B server's scheduler process (scripts/gpu/spy_schedulers.sh:
# spy/; scripts/spy_summary.py reads it). SCHED_TIMELINE=1 has every A/B server record its
# scheduler loop's host timeline (faser_sglang/sched_timeline.py: timeline/, and
# timeline.md from scripts/sched_timeline.py).
# STEP_PROFILE="<contenders>" (e.g. "faser-k3 faser-k3@draft_chain=false faser-ad", or with server flags of
# their own, "faser-k3 faser-k3+speculative-draft-attention-backend=triton") profiles, in call 3
# before the A/B, where each one's decode steps spend their time at STEP_CONCURRENCY requests
# (default "1 4 8"; scripts/profile_step.py: steps/steps.md); STEP_TEMPERATURE=0.8 profiles
# sampled requests (a sampled chain; "faser-k3@sampled_chain=false" drafts them one forward
# at a time).
# PROFILE_DRAFT_BACKEND=triton profiles the costs with the draft on Triton (the cost file's key
# then names it), for contenders that serve it so, e.g. CONTENDERS="no-spec
# faser-ad+speculative-draft-attention-backend=triton
# faser-ad@draft_ahead=true+speculative-draft-attention-backend=triton standalone-k3"
# (drafting ahead needs a draft that plans on the device: faser_sglang/spec_worker/draft_ahead.py).
# PAIR_PRESET picks the cost-faithful pair (faser_sglang/kit/presets.py: cost-faithful, the
# default, 7.18B / 0.42B; cost-faithful-14b, 13.5B / 0.42B); the same value on every call.
#
#   FASER_COMMIT=<sha> [PAIR_PRESET=...] bash scripts/gpu/measure.sh 1|2|3|4
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
RES=/tmp/faser-results
TINY=/tmp/faser-tiny
MODELS=/tmp/faser-models
WARM=/tmp/faser-warm
DEEP=/tmp/faser-deep  # full-depth shape twins of the preset (stages "period" and "twins-ab")
mkdir -p "$OUT" "$RES"
log() { echo "[measure $(date -u +%T)] $*" | tee -a "$RES/measure.log"; }
collect() { tar czf "$OUT/results.tgz" -C "$RES" . && log "collected: $(du -sh "$RES" | cut -f1)"; }
background() {  # background NAME CMD...: survives the end of this call
  local name=$1; shift
  setsid nohup bash -c "$*" >"$RES/$name.log" 2>&1 </dev/null &
}
trap collect EXIT
wait_for() {  # wait_for FILE: at most $WAIT s (a call's limit is 600), collecting every minute
  for i in $(seq 1 $((${WAIT:-540} / 5))); do
    [[ -f $RES/$1 ]] && return
    (( i % 12 == 0 )) && collect >/dev/null
    sleep 5
  done
}
receive_gguf() {  # the carried GGUF part joined to the earlier ones; FASER_SMOLLM2_GGUF once complete
  eval "$(bash scripts/gpu/stage_gguf.sh --receive | tail -1)"
  [[ -n ${FASER_SMOLLM2_GGUF:-} ]] || { log "GGUF incomplete"; exit 1; }
}
tiny_pair() {  # the tiny target and its perturbed draft (tests, soak, host profile, tiny-ab)
  python3 scripts/build_models.py tiny $TINY/target >/dev/null
  python3 scripts/build_models.py perturb $TINY/target $TINY/draft --noise 0.05 --seed 2 >/dev/null
}
PAIR_PRESET=${PAIR_PRESET:-cost-faithful}
preset() { python3 -m faser_sglang.kit.presets "$PAIR_PRESET" "$1"; }  # no torch import: fast
SERVER_FLAGS="--attention-backend flashinfer --dtype bfloat16 --cuda-graph-backend-prefill disabled"
TINY_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 64 --mem-fraction-static 0.3 --max-total-tokens 200000"
BIG_FLAGS="$SERVER_FLAGS --cuda-graph-max-bs 128 --max-running-requests 128 --max-total-tokens $(preset max-total-tokens) --mem-fraction-static 0.8"
export FASER_GPU_RESULTS=$RES/gpu_results.jsonl
NUM_GPUS=$(nvidia-smi -L | wc -l)
# The bursty A/B, then throughput and latency vs request rate (Poisson, SWEEP_RATES),
# each contender one server replaying all of them (calls 3 and "ab").
ab_cmd() {  # ab_cmd MODELS_DIR [SERVER_FLAGS] [NEW_TOKENS]: the A/B over MODELS_DIR/target and
            # MODELS_DIR/draft (default BIG_FLAGS, 256 new tokens a request)
  echo "python3 -m faser_sglang.bench.ab --target $1/target --draft $1/draft --out $RES/ab \
  $( (( NUM_GPUS >= 2 )) && echo --gpus 0 1) \
  --contenders ${CONTENDERS:-no-spec no-spec-control faser-ad faser-ad-sync standalone-k1 standalone-k3 standalone-k5 ngram faser} \
  --faser-ad-config $RES/faser-ad.json --workload humaneval --max-new-tokens ${3:-256} --k-max 7 \
  --rate ${RATE:-6} --peak-to-valley 20 --duration ${DURATION:-60} --burst-min 5 --burst-max 20 \
  --sweep-rates ${SWEEP_RATES-2 6 12} --sweep-duration ${SWEEP_DURATION:-30} \
  --temperature ${AB_TEMPERATURE:-0} --top-p 0.95 \
  --server-args ${2:-$BIG_FLAGS} 2>&1 | grep --line-buffered -v '^\[20' || true"  # later stages run regardless
}
ab_diagnosed() {  # ab_diagnosed MODELS_DIR [SERVER_FLAGS] [NEW_TOKENS]: ab_cmd, with the scheduler
                  # timeline (SCHED_TIMELINE) and py-spy (SPY) around it
  cat <<EOF
      rm -f $RES/spy.pid
      rm -rf $RES/timeline
      if [[ -n '${SCHED_TIMELINE:-}' ]]; then export FASER_SCHED_TIMELINE=$RES/timeline; fi
      if [[ -n '${SPY:-}' ]]; then bash scripts/gpu/spy_schedulers.sh $RES/spy & echo \$! > $RES/spy.pid; fi
      $(ab_cmd "$@")
      if [[ -f $RES/spy.pid ]]; then kill \$(cat $RES/spy.pid) || true; fi
      unset FASER_SCHED_TIMELINE
      if [[ -d $RES/timeline ]]; then python3 scripts/sched_timeline.py $RES/timeline > $RES/timeline.md || true; fi
EOF
}

case ${1:?call: 1|2|3|4} in
  1)
    { echo "commit: ${FASER_COMMIT:-unknown}  date: $(date -u +%FT%TZ)"
      nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; } | tee "$RES/run-info.txt"
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log"
    # The host cost of a CUDA graph launch by size and shape, with and without a profiler
    # (under half a minute), while the GPU has nothing else to do.
    python3 scripts/gpu/graph_launch.py --out $RES/graph-launch 2>&1 | tee "$RES/graph-launch.md"
    tiny_pair
    rm -f $RES/tests.done $RES/warm.done $RES/gpu1.started $RES/gpu1.done  # markers of an earlier call 1
    # Kernel warm-up: a fresh machine compiles attention and sampling kernels on the first
    # server start (~4.5 min for the 7B target). Tiny models widened to the cost-faithful
    # pair's attention shapes (head_dim, GQA groups; 2 layers) compile them now, while
    # the GGUF travels and the pair is built; timing waits for warm.done.
    log "background: kernel warm-up (shape twins of the cost-faithful pair; no-spec, faser, standalone-k1, ngram)"
    background warm "python3 scripts/build_models.py twins $TINY/target $WARM --preset $PAIR_PRESET >/dev/null \
      && python3 -m faser_sglang.bench.quick --target $WARM/target --draft $WARM/draft \
        --contenders no-spec faser standalone-k1 ngram --concurrency 8 --num-prompts 16 --max-new-tokens 16 \
        --log-dir $RES/warm-logs --server-args $SERVER_FLAGS --cuda-graph-max-bs 128 --max-running-requests 128 \
        --mem-fraction-static 0.15 --max-total-tokens 50000 2>&1 | grep -v '^\[20' | tail -8; touch $RES/warm.done"
    if [[ ${TESTS_K:-} == skip ]]; then  # on a fresh machine the tests take minutes that call 3's build waits for
      log "no GPU tests (TESTS_K=skip)"
      touch $RES/tests.done
    else
      log "background: single-GPU tests on GPU 0 (-k '${TESTS_K:=not tp2 and not gpu_fuzz}')"
      background tests "CUDA_VISIBLE_DEVICES=0 FASER_GPU_FUZZ_SEEDS=${FUZZ_SEEDS:-8} FASER_GPU_FUZZ_CASES=${FUZZ_CASES:-64} \
        OUT=$RES/tests bash scripts/gpu/run_gpu_tests.sh -k '$TESTS_K' | tail -40; touch $RES/tests.done"
    fi
    if (( NUM_GPUS < 2 )); then
      log "one GPU: nothing in the background beside the tests (timing runs need the GPU to themselves)"
      exit 0
    fi
    touch $RES/gpu1.started
    if [[ ${GPU1_JOB:-fuzz} == soak ]]; then
      log "background: soak, 8 min on GPU 1"
      background gpu1 "CUDA_VISIBLE_DEVICES=1 python3 -m faser_sglang.bench.soak --target $TINY/target \
        --draft $TINY/draft --out $RES/soak --duration 480 --rate 8 --peak-to-valley 10 --abort-fraction 0.1 \
        --k-max 5 --server-args $TINY_FLAGS; touch $RES/gpu1.done"
    else
      log "background: differential fuzzing on GPU 1 (${FUZZ_SEEDS:-8} seeds x ${FUZZ_CASES:-64} cases)"
      background gpu1 "CUDA_VISIBLE_DEVICES=1 FASER_GPU_FUZZ_SEEDS=${FUZZ_SEEDS:-8} FASER_GPU_FUZZ_CASES=${FUZZ_CASES:-64} \
        OUT=$RES/fuzz bash scripts/gpu/run_gpu_tests.sh -k gpu_fuzz | tail -40; touch $RES/gpu1.done"
    fi ;;
  2)
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log"
    # The allocator's host time on this machine's CPU (the tests print it; the background
    # jobs of call 1 share the CPU, so best of 5 rounds).
    python3 -m pytest -p no:cacheprovider -q -s tests/test_adaptive_drafter.py -k allocator_overhead 2>&1 \
      | grep 'adaptive choose' | tee "$RES/allocator-overhead.txt" ;;
  3)
    receive_gguf
    # AD_TRACE=1: FASER-AD traces every decode step (synchronizing at each phase, so its
    # timings are a diagnosis, not a contender's speed), checked against the cost model.
    # A greedy A/B (no AB_TEMPERATURE) has no sampled step: FASER-AD skips capturing the
    # sampled chains' graphs (about 30 s of its start on the 13.5B pair), which serve none.
    SAMPLED_CHAIN=$( [[ ${AB_TEMPERATURE:-0} == 0 ]] && echo ', "sampled_chain": false')
    echo "{\"policy\": \"adaptive\", \"cost_model_path\": \"$RES/costs.json\"${AD_TRACE:+, \"trace_path\": \"$RES/faser-ad-trace.jsonl\"}$SAMPLED_CHAIN}" > $RES/faser-ad.json
    # The step profile's faser-ad, never traced (a trace synchronizes every phase); a
    # greedy profile's skips the sampled chains too (profile_step.py's faser-k<K> do).
    STEP_SAMPLED=$( [[ ${STEP_TEMPERATURE:-0} == 0 ]] && echo ', "sampled_chain": false')
    echo "{\"policy\": \"adaptive\", \"cost_model_path\": \"$RES/costs.json\"$STEP_SAMPLED}" > $RES/faser-ad-untraced.json
    rm -f $RES/faser-ad-trace.jsonl
    rm -f $RES/ab.done $RES/big.done
    log "background: build pair (GPU 0), profile, A/B (one lane per GPU: $NUM_GPUS), TP=2"
    # On one GPU the tests of call 1 first: the pair's distillation beside them left a
    # test's server no memory for its KV cache.
    ONE_GPU_WAIT=$( (( NUM_GPUS < 2 )) && echo "while [[ ! -f $RES/tests.done ]]; do sleep 2; done" || true )
    background big "set -eo pipefail
      export FASER_SMOLLM2_GGUF=$FASER_SMOLLM2_GGUF
      $ONE_GPU_WAIT
      CUDA_VISIBLE_DEVICES=0 python3 scripts/build_models.py pair $MODELS --preset $PAIR_PRESET \
        --distill-steps ${DISTILL_STEPS:-1000} 2>&1 | tail -20
      cp $MODELS/pair.json $RES/
      while [[ ! -f $RES/tests.done || ! -f $RES/warm.done ]]; do sleep 2; done  # GPU 0 to itself before timing
      if [[ -f '${COSTS:-}' ]]; then cp '${COSTS:-}' $RES/costs.json  # an earlier profile of this pair
      # Batch sizes up to the A/B's running requests, and long contexts, so the fit
      # tells a batch's size from its context length.
      else CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_costs.py --target $MODELS/target --draft $MODELS/draft \
        --out $RES/costs.json --k-max 7 --batch-sizes 1,4,16,64,128 --long-batch-sizes 4,16 \
        --max-new-tokens 48 --server-args '$BIG_FLAGS' ${PROFILE_DRAFT_BACKEND:+--draft-attention-backend $PROFILE_DRAFT_BACKEND} \
        2>&1 | grep -v '^\[20' | tail -20; fi
      while [[ -f $RES/gpu1.started && ! -f $RES/gpu1.done ]]; do sleep 2; done  # GPU 1 free before timing
      if [[ -n '${STEP_PROFILE:-}' ]]; then  # where a decode step's time goes, per phase (steps/steps.md)
        CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_step.py --target $MODELS/target --draft $MODELS/draft \
          --out $RES/steps --contenders ${STEP_PROFILE:-} --faser-ad-config $RES/faser-ad-untraced.json --k-max 7 \
          --concurrency ${STEP_CONCURRENCY:-1 4 8} --temperature ${STEP_TEMPERATURE:-0} --server-args '$BIG_FLAGS' 2>&1 | grep -v '^\[20' | tail -80 || true
        rm -f $RES/steps/*.trace.json.gz  # megabytes each; steps.json holds what they say
      fi
$(ab_diagnosed $MODELS)
      if [[ -n '${AD_TRACE:-}' ]]; then
        python3 scripts/check_costs.py --costs $RES/costs.json --trace $RES/faser-ad-trace.jsonl \
          --steps-csv $RES/faser-ad-steps.csv > $RES/check-costs.md 2>&1 || true
        gzip -f $RES/faser-ad-trace.jsonl || true  # no trace without a faser-ad contender
      fi
      touch $RES/ab.done
      if [[ -n '${LAZY_PROFILE:-}' ]]; then  # long catch-ups: traced steps of a lazily prefilled profile
        CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_costs.py --target $MODELS/target --draft $MODELS/draft \
          --out $RES/costs-lazy.json --work-dir $RES/profile-lazy --draft-prefill lazy --k-max 7 \
          --batch-sizes '${LAZY_PROFILE:-}' --long-batch-sizes '' --max-new-tokens 16 \
          --server-args '$BIG_FLAGS' 2>&1 | grep -v '^\[20' | tail -20 || true
      fi
      if (( $NUM_GPUS >= 2 )); then
        OUT=$RES/tests-tp2 bash scripts/gpu/run_gpu_tests.sh -k tp2 | tail -15 || true
        python3 -m faser_sglang.bench.ab --target $MODELS/target --draft $MODELS/draft --out $RES/ab-tp2 \
          --contenders no-spec faser standalone-k3 --workload humaneval --max-new-tokens 256 --k-max 7 \
          --rate ${RATE:-6} --peak-to-valley 20 --duration ${DURATION_TP2:-40} --burst-min 5 --burst-max 20 \
          --server-args $BIG_FLAGS --tp 2 2>&1 | grep -v '^\[20'
      fi
      touch $RES/big.done" ;;
  stage)  # install and receive the carried GGUF part, nothing else (before "draft")
    bash scripts/gpu/stage_gguf.sh --receive | tee -a "$RES/measure.log" ;;
  draft)  # the preset's distilled draft alone, unwidened, with its agreement (pair.json), in
          # the background (about 5 min; the call waits at most WAIT s, collecting each minute)
    receive_gguf
    rm -f $RES/draft.done
    background draft "FASER_SMOLLM2_GGUF=$FASER_SMOLLM2_GGUF python3 scripts/build_models.py pair \
      $MODELS-draft --preset $PAIR_PRESET --distill-steps ${DISTILL_STEPS:-1000} --no-widen; \
      cp $MODELS-draft/pair.json $RES/; touch $RES/draft.done"
    wait_for draft.done; tr '\r' '\n' < $RES/draft.log | grep -E '100%|^[ {}"]' | tail -40 ;;
  host)  # per-step host cost of each contender, tiny pair, GPU 0 (scripts/profile_host.py), in
         # the background; the call waits for it (at most WAIT s); call "host-wait" waits more
    [[ -d $TINY/draft ]] || tiny_pair
    rm -f $RES/host.done
    background host "CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_host.py --target $TINY/target \
      --draft $TINY/draft --out $RES/host --contenders ${CONTENDERS:-faser-k0 faser-k0-sync no-spec-sync no-spec faser standalone-k1} \
      --concurrency 32 128 --max-new-tokens ${MAX_NEW_TOKENS:-1000} --server-args '$SERVER_FLAGS \
      --cuda-graph-max-bs 128 --max-running-requests 128 --mem-fraction-static 0.3 --max-total-tokens 300000' \
      2>&1 | grep --line-buffered -v '^\[20'; touch $RES/host.done"
    wait_for host.done; tail -12 $RES/host.log ;;
  host-wait)
    wait_for host.done; tail -12 $RES/host.log ;;
  period)  # the decode step period of each contender, with the 13.5B pair's costs but no GGUF:
           # full-depth shape twins of the preset (ballast layers; both compute the tiny
           # model's logits, so the target accepts every draft), after call 1's tests and
           # warm-up, GPU 0 (scripts/profile_host.py: period/host.md), in the background;
           # the call waits at most WAIT s, "period-wait" waits more
    [[ -d $TINY/target ]] || python3 scripts/build_models.py tiny $TINY/target >/dev/null
    rm -f $RES/period.done
    PERIOD_MAX_BS=${PERIOD_MAX_BS:-64}
    PERIOD_TOKENS=$(( PERIOD_MAX_BS * 900 > 100000 ? PERIOD_MAX_BS * 900 : 100000 ))  # 800 new tokens a request
    background period "python3 scripts/build_models.py twins $TINY/target $DEEP --preset $PAIR_PRESET \
        --full-depth >/dev/null
      while [[ ! -f $RES/tests.done || ! -f $RES/warm.done ]]; do sleep 2; done  # GPU 0 to itself
      CUDA_VISIBLE_DEVICES=0 python3 scripts/profile_host.py --target $DEEP/target \
        --draft $DEEP/draft --out $RES/period --contenders ${CONTENDERS:-faser-k3@draft_ahead=true+speculative-draft-attention-backend=triton \
        faser-k3+speculative-draft-attention-backend=triton no-spec} \
        --concurrency ${HOST_CONCURRENCY:-1 4 16} --max-new-tokens ${MAX_NEW_TOKENS:-800} --server-args '$SERVER_FLAGS \
        --cuda-graph-max-bs $PERIOD_MAX_BS --max-running-requests $PERIOD_MAX_BS --mem-fraction-static 0.8 \
        --max-total-tokens $PERIOD_TOKENS' 2>&1 | grep --line-buffered -v '^\[20'; touch $RES/period.done"
    wait_for period.done; tail -12 $RES/period.log ;;
  period-wait)
    wait_for period.done; tail -12 $RES/period.log ;;
  soak)  # the soak alone, in the foreground (8 min; on a one-GPU machine)
    tiny_pair
    python3 -m faser_sglang.bench.soak --target $TINY/target --draft $TINY/draft --out $RES/soak \
      --duration 480 --rate 8 --peak-to-valley 10 --abort-fraction 0.1 --k-max 5 --server-args $TINY_FLAGS \
      2>&1 | grep -v '^\[20' | tail -20 ;;
  ab)  # the A/B stage again with other settings (after call 3, machine still warm): stops
       # a running "big" and its servers, keeps the pair and cost file, then waits like call 4.
       # AB_MODELS=/tmp/faser-deep runs it on the shape twins of an earlier twins-ab call
    pkill -f 'set -eo pipefail'; pkill -f faser_sglang.bench.ab; pkill -f sglang.launch_server
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9; sleep 3
    rm -f $RES/ab.done $RES/big.done
    log "background: A/B again (${CONTENDERS:-all contenders})"
    background big "$(ab_diagnosed ${AB_MODELS:-$MODELS}); touch $RES/ab.done $RES/big.done"
    wait_for big.done; grep '^\[ab\]' "$RES/big.log" | tail -20 ;;
  twins-ab)  # the bursty A/B (CONTENDERS, with SCHED_TIMELINE and SPY as in call 3) on full-depth
             # shape twins of the preset: the pair's forward costs without the GGUF or a pair
             # build, every draft accepted, FASER-AD on the analytical cost model (a profile of
             # twins would price drafts no real pair accepts). For host-side questions, such
             # as what a prefill's launch costs each server. First, how long a small
             # host-to-device copy waits behind queued GPU work on this machine (h2d-sync.md);
             # in the background, once the GPU is free, what FlashInfer's prefill plan waits
             # for with device or host pointers (prefill-plan.md), then the A/B. After call 1,
             # or on a fresh machine, where the GPU tests TESTS_K (if set) run first in the
             # background. The call waits at most WAIT s, call 4 waits more
    [[ -d $TINY/target ]] || python3 scripts/build_models.py tiny $TINY/target >/dev/null
    python3 scripts/gpu/check_h2d_sync.py 2>&1 | tee "$RES/h2d-sync.md"
    if [[ ! -f $RES/run-info.txt ]]; then  # no call 1 on this machine: its GPU tests are this stage's
      rm -f $RES/tests.done; touch $RES/warm.done
      log "background: GPU tests (-k '${TESTS_K:-}'), while the twins are built"
      background tests "${TESTS_K:+OUT=$RES/tests bash scripts/gpu/run_gpu_tests.sh -k '$TESTS_K' | tail -15;} \
        touch $RES/tests.done"
    fi
    echo '{"policy": "adaptive", "sampled_chain": false}' > $RES/faser-ad.json
    rm -f $RES/ab.done $RES/big.done
    log "background: full-depth shape twins, the prefill plan check, the A/B (${CONTENDERS:-all contenders})"
    background big "set -eo pipefail
      python3 scripts/build_models.py twins $TINY/target $DEEP --preset $PAIR_PRESET --full-depth >/dev/null
      while [[ ! -f $RES/tests.done || ! -f $RES/warm.done ]]; do sleep 2; done  # GPU 0 to itself
      python3 scripts/gpu/check_prefill_plan.py > $RES/prefill-plan.md 2>&1 || true
      $(ab_diagnosed $DEEP)
      touch $RES/ab.done $RES/big.done"
    wait_for big.done; grep '^\[ab\]' "$RES/big.log" | tail -20 ;;
  tiny-ab)  # on a fresh machine, in one call of a few minutes, no GGUF: how long a small
            # host-to-device copy waits behind queued GPU work (h2d-sync.md), the GPU tests
            # TESTS_K if set, then the bursty A/B (CONTENDERS, SCHED_TIMELINE, SPY, RATE,
            # DURATION, SWEEP_RATES) on the tiny pair with 64 new tokens a request. A host cost
            # that does not grow with the model's depth shows here in full
    tiny_pair
    python3 scripts/gpu/check_h2d_sync.py 2>&1 | tee "$RES/h2d-sync.md"
    if [[ -n ${TESTS_K:-} ]]; then OUT=$RES/tests bash scripts/gpu/run_gpu_tests.sh -k "$TESTS_K" | tail -15; fi
    echo '{"policy": "adaptive"}' > $RES/faser-ad.json
    eval "$(ab_diagnosed $TINY "$TINY_FLAGS" 64)" ;;
  4)
    # Wait for "big", at most $WAIT seconds (the call's limit is 600), collecting every
    # minute so a call cut short still returns what was measured.
    wait_for big.done
    tail -30 "$RES/big.log"; tail -3 "$RES/gpu1.log"; tail -5 "$RES/tests.log"
    [[ -f $RES/big.done ]] || log "still running (collecting what exists)" ;;
esac
