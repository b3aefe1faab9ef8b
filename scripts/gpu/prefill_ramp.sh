#!/usr/bin/env bash
# Back-to-back prefills on shape twins of the cost-faithful pair (the pair's widths, 2
# layers, so a forward's GPU time is small and an iteration's time is mostly the host's):
# no-spec against FASER (adaptive policy, lazy draft prefill), each served a closed loop
# of 2-token requests; both record their scheduler loop's timeline (timeline/ and
# timeline.md, scripts/sched_timeline.py) and py-spy samples every scheduler process
# (spy_schedulers.sh). Leaves under $OUT the server logs (server-N.log, in start order)
# with their prefill intervals (prefill-gaps.md, scripts/prefill_gaps.py) and the
# schedulers' stacks with their event-loop profiles (spy-summary.md, scripts/spy_summary.py; the first
# requests' kernel compiles left out). One device call on a fresh machine (carry
# .bundle/sglang-gpu.tar.xz), ~6.5 min, most of it FlashInfer's first compile
# (ATTENTION_BACKEND=triton skips it; CONCURRENCY="16" for one closed loop).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PAIR_PRESET=${PAIR_PRESET:-cost-faithful-14b}
preset() { python3 -m faser_sglang.kit.presets "$PAIR_PRESET" "$1"; }
TINY=/tmp/faser-tiny
TWINS=/tmp/faser-twins
if [[ ! -d $TWINS/draft ]]; then
  python3 scripts/build_models.py tiny $TINY/target >/dev/null
  python3 scripts/build_models.py widen $TINY/target $TWINS/target $(preset target) >/dev/null
  python3 scripts/build_models.py widen $TINY/target $TWINS/draft $(preset draft) >/dev/null
fi
echo '{"policy": "adaptive"}' > "$OUT/faser.json"
bash scripts/gpu/spy_schedulers.sh "$OUT" &
SPY=$!
rm -f /tmp/sglang-*.log
FASER_SCHED_TIMELINE=$OUT/timeline FASER_CONFIG=$OUT/faser.json python3 -m faser_sglang.bench.quick --target $TWINS/target --draft $TWINS/draft \
  --k-max 7 --contenders no-spec faser --concurrency ${CONCURRENCY:-4 16} --num-prompts 300 --max-new-tokens 2 \
  --prompts humaneval --server-args --attention-backend ${ATTENTION_BACKEND:-flashinfer} --dtype bfloat16 --cuda-graph-backend-prefill disabled \
  --cuda-graph-max-bs 128 --max-running-requests 128 --mem-fraction-static 0.3 --max-total-tokens 200000 \
  2>&1 | grep -v '^\[20' | tail -12
kill $SPY 2>/dev/null || true
sleep 3  # py-spy writes its file when the server it samples exits
i=0
for log in $(ls -tr /tmp/sglang-*.log); do cp "$log" "$OUT/server-$i.log"; i=$((i + 1)); done
python3 scripts/prefill_gaps.py "$OUT"/server-*.log | tee "$OUT/prefill-gaps.md"
python3 scripts/sched_timeline.py "$OUT/timeline" | tee "$OUT/timeline.md"
python3 scripts/spy_summary.py --exclude _do_compile JitSpec.build compile launch_metadata -- "$OUT"/spy-*.txt \
  > "$OUT/spy-summary.md"
