#!/usr/bin/env bash
# Back-to-back prefills on shape twins of the cost-faithful pair (the pair's widths, 2
# layers, so a forward's GPU time is small and an iteration's time is mostly the host's):
# no-spec against FASER (adaptive policy, lazy draft prefill), each served a closed loop
# of 2-token requests. Both servers record their scheduler loop's timeline
# (faser_sglang/sched_timeline.py) and py-spy samples every scheduler process
# (spy_schedulers.sh). Leaves under $OUT:
#   prefill-gaps.md     prefill intervals from the server logs (scripts/prefill_gaps.py)
#   timeline-mean.md    per-iteration splits of the timelines (scripts/sched_timeline.py),
#   timeline-median.md  the medians robust to the first requests' kernel compiles
#   spy-summary.md      event-loop profiles (scripts/spy_summary.py, compiles left out)
#   ramp.tgz            what they were read from: server-N.log (in start order),
#                       timeline/, spy-<pid>.txt and .cmd
# One device call on a fresh machine (carry .bundle/sglang-gpu.tar.xz), ~6.5 min, most
# of it FlashInfer's first compile (ATTENTION_BACKEND=triton: ~4 min; CONCURRENCY="16"
# for one closed loop).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PAIR_PRESET=${PAIR_PRESET:-cost-faithful-14b}
TINY=/tmp/faser-tiny
TWINS=/tmp/faser-twins  # kept while the machine stays warm (build_models.py checks the recipe)
python3 scripts/build_models.py tiny $TINY/target >/dev/null
python3 scripts/build_models.py twins $TINY/target $TWINS --preset $PAIR_PRESET >/dev/null
W=/tmp/faser-ramp  # everything; $OUT gets the summaries and one archive (8 files come back)
rm -rf $W /tmp/sglang-*.log
mkdir -p $W
echo '{"policy": "adaptive"}' > "$W/faser.json"
bash scripts/gpu/spy_schedulers.sh "$W" &
SPY=$!
FASER_SCHED_TIMELINE=$W/timeline FASER_CONFIG=$W/faser.json python3 -m faser_sglang.bench.quick \
  --target $TWINS/target --draft $TWINS/draft --k-max 7 --contenders no-spec faser \
  --concurrency ${CONCURRENCY:-4 16} --num-prompts 300 --max-new-tokens 2 --prompts humaneval \
  --server-args --attention-backend ${ATTENTION_BACKEND:-flashinfer} --dtype bfloat16 \
  --cuda-graph-backend-prefill disabled --cuda-graph-max-bs 128 --max-running-requests 128 \
  --mem-fraction-static 0.3 --max-total-tokens 200000 2>&1 | grep -v '^\[20' | tail -12
kill $SPY 2>/dev/null || true
sleep 3  # py-spy writes its file when the server it samples exits
i=0
for log in $(ls -tr /tmp/sglang-*.log); do cp "$log" "$W/server-$i.log"; i=$((i + 1)); done
python3 scripts/prefill_gaps.py "$W"/server-*.log | tee "$OUT/prefill-gaps.md"
for stat in mean median; do
  python3 scripts/sched_timeline.py "$W/timeline" --stat $stat | tee "$OUT/timeline-$stat.md"
done
python3 scripts/spy_summary.py --exclude _do_compile JitSpec.build compile launch_metadata -- "$W"/spy-*.txt \
  > "$OUT/spy-summary.md"
tar czf "$OUT/ramp.tgz" -C $W .
