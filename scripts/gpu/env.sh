# Sourced by the GPU scripts: install the offline SGLang bundle and this package
# into /tmp/faser-site (kept while the machine stays warm) and set the environment.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# SGLang's remedy for STANDALONE's verify graphs at 128 rows overflowing FlashInfer's
# default 384 MiB workspace (their capture fails on an H100 and at K = 5 on an H200);
# the same for every server of a run, so no contender starts with less.
export SGLANG_FLASHINFER_WORKSPACE_SIZE=${SGLANG_FLASHINFER_WORKSPACE_SIZE:-536870912}
FASER_SITE=${FASER_SITE:-/tmp/faser-site}
eval "$(bash scripts/gpu/install_bundle.sh "$FASER_SITE" | tail -1)"
export PATH=$FASER_SITE/bin:$PATH  # console scripts of the bundle (py-spy)
# This package goes next to the bundle so its sglang.srt.plugins entry point is found
# by every SGLang process; no build isolation (no network there). Skipped when this
# same source is installed: servers still running from an earlier call keep importing
# from there.
FASER_SRC_ID=$(cat pyproject.toml $(find faser_sglang -name '*.py' | sort) | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$FASER_SITE/.faser-src.sha256" 2>/dev/null)" != "$FASER_SRC_ID" ]]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$FASER_SITE" . >/dev/null
  echo "$FASER_SRC_ID" > "$FASER_SITE/.faser-src.sha256"
fi
export PYTHONPATH=$PWD/tests:$PYTHONPATH
