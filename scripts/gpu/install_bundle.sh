#!/usr/bin/env bash
# Install the offline SGLang bundle on the GPU machine (no network needed).
#
#   scripts/gpu/install_bundle.sh SITE_DIR
#   eval "$(scripts/gpu/install_bundle.sh SITE_DIR | tail -1)"   # sets PYTHONPATH
#
# Unpacks .bundle/sglang-gpu.tar.xz (built by scripts/gpu/build_bundle.sh) under /tmp and runs
#   python3 -m pip install -q --no-index --no-deps --no-compile --target SITE_DIR <wheels>
# Skips everything when SITE_DIR already holds sglang 0.5.17 from this same tarball.
# The last line printed is always the export line for PYTHONPATH.
# Env: PYTHON (default python3), BUNDLE_TARBALL (default <repo>/.bundle/sglang-gpu.tar.xz).
set -euo pipefail

SITE=${1:?usage: install_bundle.sh SITE_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TARBALL=${BUNDLE_TARBALL:-$REPO/.bundle/sglang-gpu.tar.xz}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.17

mkdir -p "$SITE"
SITE=$(cd "$SITE" && pwd)
STAMP=$SITE/.sglang-gpu-bundle.stamp
export_line() { echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"; }

# Identify the tarball by content (sha256 of ~40 MB: ~0.1 s), so copies with new mtimes still match.
TAR_ID=
[[ -f $TARBALL ]] && TAR_ID="$(sha256sum "$TARBALL" | cut -d' ' -f1)"

if [[ -d $SITE/sglang-$SGLANG_VERSION.dist-info ]]; then
  if [[ -z $TAR_ID || ! -f $STAMP || "$(cat "$STAMP")" == "$TAR_ID" ]]; then
    echo "install_bundle: $SITE already has sglang $SGLANG_VERSION; skipping" >&2
    export_line
    exit 0
  fi
  echo "install_bundle: bundle changed since last install; reinstalling into $SITE" >&2
fi

[[ -f $TARBALL ]] || { echo "install_bundle: $TARBALL not found (run scripts/gpu/build_bundle.sh)" >&2; exit 1; }

T0=$(date +%s)
TMP=$(mktemp -d /tmp/sglang-gpu-bundle.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
tar -xJf "$TARBALL" -C "$TMP"
shopt -s nullglob
WHEELS=("$TMP"/sglang-gpu/*.whl)
((${#WHEELS[@]})) || { echo "install_bundle: no wheels in $TARBALL" >&2; exit 1; }

# --upgrade: replace package dirs left by an older bundle instead of pip's "already exists" warning.
"$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
  --target "$SITE" "${WHEELS[@]}"
[[ -d $SITE/sglang-$SGLANG_VERSION.dist-info ]] || { echo "install_bundle: sglang $SGLANG_VERSION missing after install" >&2; exit 1; }
echo "$TAR_ID" >"$STAMP"
echo "install_bundle: installed ${#WHEELS[@]} wheels into $SITE in $(($(date +%s) - T0)) s" >&2
export_line
