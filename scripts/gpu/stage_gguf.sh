#!/usr/bin/env bash
# The SmolLM2 GGUF (98 MB) is larger than one transfer to the GPU machine (64 MiB with
# the repo), so it travels in three parts, one per device call: part-00 fills what the
# SGLang bundle leaves of the first call, part-01 a whole call, part-02 the rest.
#   here:  bash scripts/gpu/stage_gguf.sh            -> .bundle/gguf/part-00 .. part-02 + SHA256
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
cut_part part-00 0 "$FIRST"
cut_part part-01 "$FIRST" "$SECOND"
cut_part part-02 $((FIRST + SECOND))
sha256sum "$SRC" | cut -d' ' -f1 > "$PARTS/SHA256"
ls -la "$PARTS"
