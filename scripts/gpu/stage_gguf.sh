#!/usr/bin/env bash
# The SmolLM2 GGUF (98 MB) is larger than one transfer to the GPU machine (64 MiB with
# the repo), so it travels in parts, one per device call: part-00 fills what the SGLang
# bundle leaves of the first call (none when the checkout leaves less than 1 MiB there),
# part-01 onwards what the checkout leaves of a whole call, the last one the rest. Three
# parts while the checkout is under ~20 MB, four beyond; the script prints which call of
# scripts/gpu/measure.sh carries which.
#   here:  bash scripts/gpu/stage_gguf.sh            -> .bundle/gguf/part-* + SHA256
#   there: bash scripts/gpu/stage_gguf.sh --receive  (in each call that carries a part)
# The receiving side appends the carried parts to /tmp/faser-gguf (kept while the
# machine stays warm) and, once complete and checksummed, prints the export line for
# FASER_SMOLLM2_GGUF.
set -euo pipefail
cd "$(dirname "$0")/../.."
PARTS=.bundle/gguf
DEST=/tmp/faser-gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ${1:-} == --receive ]]; then
  mkdir -p "$DEST"
  for part in "$PARTS"/part-*; do
    [[ -f $part ]] && cp "$part" "$DEST/"
  done
  cp "$PARTS/SHA256" "$DEST/" 2>/dev/null || true
  cat "$DEST"/part-* > "$DEST/$NAME.tmp"
  if [[ -f $DEST/SHA256 ]] && [[ "$(sha256sum "$DEST/$NAME.tmp" | cut -d' ' -f1)" == "$(cat "$DEST/SHA256")" ]]; then
    mv "$DEST/$NAME.tmp" "$DEST/$NAME"
    echo "export FASER_SMOLLM2_GGUF=$DEST/$NAME"
  else
    rm -f "$DEST/$NAME.tmp"
    echo "stage_gguf: have $(ls "$DEST"/part-* | wc -l) part(s); not complete yet" >&2
  fi
  exit 0
fi
. .venv/bin/activate
SRC=$(python -c "from faser_sglang.kit.smollm2 import gguf_path; print(gguf_path())")
rm -rf "$PARTS" && mkdir -p "$PARTS"
MIB=$((1024 * 1024))
# Each call also carries the checkout (tracked and untracked-not-ignored files): leave
# room for it as it is now plus 2 MiB for results added before the last call.
REPO=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
RESERVE=$((REPO + 2 * MIB))
FIRST=$((64 * MIB - $(stat -c %s .bundle/sglang-gpu.tar.xz) - RESERVE))
SECOND=$((64 * MIB - RESERVE))
cut_part() {  # cut_part NAME OFFSET [COUNT]: bytes OFFSET.. of the GGUF
  dd if="$SRC" of="$PARTS/$1" iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} bs=4M status=none
}
TOTAL=$(stat -c %s "$SRC")
OFFSET=0
if ((FIRST >= MIB)); then
  cut_part part-00 0 "$FIRST"
  OFFSET=$FIRST
fi
INDEX=1
while ((OFFSET < TOTAL)); do
  cut_part "$(printf 'part-%02d' $INDEX)" "$OFFSET" "$SECOND"
  OFFSET=$((OFFSET + SECOND))
  INDEX=$((INDEX + 1))
done
sha256sum "$SRC" | cut -d' ' -f1 > "$PARTS/SHA256"
ls -la "$PARTS"
# Which call carries which part: the first with the bundle (call 1), the last with call 3,
# those between with call 2 and, beyond it, `measure.sh stage` calls before call 3.
mapfile -t NAMES < <(cd "$PARTS" && ls part-*)
LAST=$((${#NAMES[@]} - 1))
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  if [[ $name == part-00 ]]; then when="call 1, with the bundle"
  elif ((i == LAST)); then when="call 3"
  elif [[ $name == part-01 ]]; then when="call 2"
  else when="a 'measure.sh stage' call after call 2"
  fi
  echo "carry $PARTS/$name: $when"
done
echo "carry $PARTS/SHA256 in any of these calls"
