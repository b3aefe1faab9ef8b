#!/usr/bin/env bash
# Build the offline SGLang GPU bundle: .bundle/sglang-gpu.tar.xz (+ .bundle/MANIFEST.txt).
#
# Runs on the CPU dev machine (needs PyPI through pip, python3 with `packaging`, binutils' `strip`, xz).
# Target: the GPU image (CPython 3.12, x86-64, torch 2.11.0+cu130), installed there offline by
# scripts/gpu/install_bundle.sh. Pins: scripts/gpu/bundle-requirements.txt.
#
#   .bundle/cache/    raw wheels from PyPI (download skipped when the pinned wheel is present)
#   .bundle/wheels/   processed wheels: stripped (see RULES below) and re-zipped ZIP_STORED
#   .bundle/sglang-gpu.tar.xz   tar of sglang-gpu/*.whl, xz-compressed (must be <= MAX_BYTES)
#   .bundle/MANIFEST.txt        wheel names + sizes
#
# Every step is skipped when its output is up to date. At the end the bundle is installed into
# /tmp/bundle_check (pip --target, cp312 tags) and every wheel's Requires-Dist (non-extra, py3.12/linux)
# is checked against bundle + image packages; requirements not listed as "# skip:" fail the build.
#
# Usage: scripts/gpu/build_bundle.sh [--no-check]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
REQS=$HERE/bundle-requirements.txt
BUNDLE=$REPO/.bundle
CACHE=$BUNDLE/cache
SLIM=$BUNDLE/wheels
TARBALL=$BUNDLE/sglang-gpu.tar.xz
MANIFEST=$BUNDLE/MANIFEST.txt
CHECK_DIR=${CHECK_DIR:-/tmp/bundle_check}
MAX_BYTES=${MAX_BYTES:-45000000}
PY=${PYTHON:-python3}
DO_CHECK=1
[[ ${1:-} == --no-check ]] && DO_CHECK=0

command -v strip >/dev/null || { echo "build_bundle: 'strip' not found (apt-get install binutils)" >&2; exit 1; }
command -v xz >/dev/null || { echo "build_bundle: 'xz' not found (apt-get install xz-utils)" >&2; exit 1; }
mkdir -p "$CACHE" "$SLIM"

# Target tags: CPython 3.12 on manylinux x86-64 (image glibc is 2.39).
TARGET_FLAGS=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for n in 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 17 5; do
  TARGET_FLAGS+=(--platform "manylinux_2_${n}_x86_64")
done
TARGET_FLAGS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)

# All the Python logic lives here; called as: tool.py CMD ...
TOOL=$(mktemp /tmp/bundle_tool.XXXXXX.py)
trap 'rm -f "$TOOL"' EXIT
cat >"$TOOL" <<'PYEOF'
import csv, base64, hashlib, io, json, os, re, struct, subprocess, sys, tempfile, zipfile
from packaging.utils import canonicalize_name as cn, parse_wheel_filename

# ---- stripping rules (changing this file's text re-processes every wheel) ----
RULES_VERSION = 3
DROP = {  # canonical dist name -> regexes of archive paths to drop
    # Rust extensions: server/_core only under TYPE_CHECKING (rust_server.py), grpc/_core only in
    # grpc mode (lazy, http_server), multimodal/_core only with SGLANG_INKLING_RS_MM_PREPROCESS=1.
    "sglang": [r"^sglang/srt/(server|grpc|multimodal)/_core\.[^/]*\.so$"],
    # Keep only the Hopper op library (load_utils picks sgl_kernel/sm90/ when cc == 90) and
    # spatial_ops; flash_ops (1.1 GB), flashmla_ops, infllm_ops and sm100/ are loaded lazily or
    # inside try (flash_mla.py keeps working as a module, raising only when called).
    "sglang-kernel": [r"^sgl_kernel/(?!sm90/common_ops\.|spatial_ops\.)[^/]*(/[^/]*)*\.so$"],
    # Static library for C++ embedding; Python loads libxgrammar_bindings.so only.
    "xgrammar": [r"^xgrammar/lib/.*\.a$"],
}
# Generic: ELF shared objects carrying .debug_* sections get `strip --strip-debug` (dynamic symbols
# untouched). auditwheel-vendored libs (*.libs/) are left alone.

def elf_sections(data):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return []
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not e_shoff or e_shstrndx >= e_shnum:
        return []
    def sh(i):
        return struct.unpack_from("<IIQQQQ", data, e_shoff + i * e_shentsize)
    _, _, _, _, str_off, str_size = sh(e_shstrndx)
    strtab = data[str_off:str_off + str_size]
    names = []
    for i in range(e_shnum):
        name_off = sh(i)[0]
        names.append(strtab[name_off:strtab.index(b"\0", name_off)].decode(errors="replace"))
    return names

def strip_debug(data):
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
        f.write(data)
    try:
        subprocess.run(["strip", "--strip-debug", f.name], check=True)
        return open(f.name, "rb").read()
    finally:
        os.unlink(f.name)

def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

def read_pins(reqs):
    pins = {}
    for line in open(reqs):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if not m:
            sys.exit(f"bad pin line in {reqs}: {line!r}")
        name = cn(m.group(1))
        if name in pins:
            sys.exit(f"duplicate pin: {name}")
        pins[name] = m.group(2)
    return pins

def read_skips(reqs):
    return {cn(m.group(1)) for m in re.finditer(r"^#\s*skip:\s*([A-Za-z0-9._-]+)", open(reqs).read(), re.M)}

def find_wheel(d, name, ver):
    hits = []
    for f in os.listdir(d):
        if f.endswith(".whl"):
            n, v, _, _ = parse_wheel_filename(f)
            if n == name and str(v) == str(parse_wheel_filename(f"x-{ver}-py3-none-any.whl")[1]):
                hits.append(f)
    return sorted(hits)

def cmd_missing(reqs, cache):
    for name, ver in read_pins(reqs).items():
        if not find_wheel(cache, name, ver):
            print(f"{name}=={ver}")

def process_one(src, dst, name):
    drops = [re.compile(p) for p in DROP.get(name, [])]
    zin = zipfile.ZipFile(src)
    changed, removed, out = {}, set(), []
    record_name = None
    for info in zin.infolist():
        path = info.filename
        if path.endswith(".dist-info/RECORD"):
            record_name = path
            continue
        if any(p.search(path) for p in drops):
            removed.add(path)
            continue
        data = zin.read(info)
        base = os.path.basename(path)
        if (base.endswith(".so") or ".so." in base) and ".libs/" not in path:
            if any(s.startswith(".debug_") for s in elf_sections(data)):
                data = strip_debug(data)
                changed[path] = data
        out.append((info, data))
    rows = list(csv.reader(io.StringIO(zin.read(record_name).decode())))
    new_rows = []
    for row in rows:
        if not row:
            continue
        if row[0] in removed:
            continue
        if row[0] in changed:
            row = [row[0], record_hash(changed[row[0]]), str(len(changed[row[0]]))]
        new_rows.append(row)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(new_rows)
    tmp = dst + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
        for info, data in out:
            zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_STORED
            zout.writestr(zi, data)
        zi = zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        zout.writestr(zi, buf.getvalue())
    os.replace(tmp, dst)
    return len(removed), len(changed)

def cmd_process(reqs, cache, slim):
    pins = read_pins(reqs)
    tool_hash = hashlib.sha256(open(__file__, "rb").read()).hexdigest()[:16]
    state_path = os.path.join(slim, ".state.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {}
    keep = set()
    for name, ver in pins.items():
        hits = find_wheel(cache, name, ver)
        if len(hits) != 1:
            sys.exit(f"expected exactly one cached wheel for {name}=={ver}, found {hits}")
        whl = hits[0]
        keep.add(whl)
        src, dst = os.path.join(cache, whl), os.path.join(slim, whl)
        key = f"{tool_hash}:{os.path.getsize(src)}"
        if os.path.exists(dst) and state.get(whl) == key:
            continue
        nrm, nstrip = process_one(src, dst, name)
        print(f"  processed {whl}: {os.path.getsize(src)/1e6:.1f} -> {os.path.getsize(dst)/1e6:.1f} MB stored"
              f" ({nrm} dropped, {nstrip} stripped)")
        state[whl] = key
        json.dump(state, open(state_path, "w"), indent=1)
    for f in os.listdir(slim):  # exactly one version of each package
        if f.endswith(".whl") and f not in keep:
            os.unlink(os.path.join(slim, f))
            state.pop(f, None)
            print(f"  removed stale {f}")
    json.dump(state, open(state_path, "w"), indent=1)

def cmd_fingerprint(slim):
    h = hashlib.sha256()
    for f in sorted(os.listdir(slim)):
        if f.endswith(".whl"):
            with open(os.path.join(slim, f), "rb") as fh:  # content, not mtime: re-processing is deterministic
                h.update(f"{f}:{hashlib.sha256(fh.read()).hexdigest()}\n".encode())
    print(h.hexdigest())

def cmd_manifest(slim, tarball, manifest):
    whls = sorted(f for f in os.listdir(slim) if f.endswith(".whl"))
    sha = hashlib.sha256(open(tarball, "rb").read()).hexdigest()
    total = 0
    lines = [f"# {os.path.basename(tarball)}  {os.path.getsize(tarball)} bytes  sha256={sha}",
             f"# {len(whls)} wheels (ZIP_STORED, sizes in bytes)"]
    for f in whls:
        s = os.path.getsize(os.path.join(slim, f))
        total += s
        lines.append(f"{s:>11}  {f}")
    lines.append(f"{total:>11}  TOTAL (uncompressed)")
    open(manifest, "w").write("\n".join(lines) + "\n")

IMAGE_PKGS = """
absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython einops filelock fonttools frozenlist fsspec h11
h5py hf-xet httpcore httpx huggingface-hub==1.33.0 humanize hypothesis idna imageio iniconfig jinja2
joblib kiwisolver lxml markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack
multidict networkx ninja numba numba-cuda numpy==2.5.2 nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx opencv-python-headless packaging pandas pathspec peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pytest pytest-timeout pytest-xdist python-dateutil pyyaml regex requests rich
safetensors==0.8.0 scikit-learn scipy sentencepiece==0.2.2 setuptools shellingham simplejson six
sortedcontainers sympy tabulate tensorboard threadpoolctl tiktoken==0.14.0 timm tokenizers==0.23.2
toolz torch==2.11.0 torchaudio torchvision==0.26.0 tqdm transformers==5.17.0 triton==3.6.0 typer
typing-extensions typing-inspect urllib3 uvloop werkzeug wheel wrapt xxhash yarl zipp
"""

def cmd_check(site, reqs):
    from packaging.requirements import Requirement
    from packaging.version import Version
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "platform_release": "", "platform_version": "", "implementation_version": "3.12.3", "extra": ""}
    image = {}
    for tok in IMAGE_PKGS.split():
        n, _, v = tok.partition("==")
        image[cn(n)] = v or None
    bundle, metas = {}, {}
    for d in sorted(os.listdir(site)):
        if d.endswith(".dist-info"):
            txt = open(os.path.join(site, d, "METADATA"), encoding="utf-8").read()
            n = cn(re.search(r"^Name: (.*)$", txt, re.M).group(1).strip())
            bundle[n] = re.search(r"^Version: (.*)$", txt, re.M).group(1).strip()
            metas[n] = [l.split(":", 1)[1].strip() for l in txt.splitlines() if l.startswith("Requires-Dist:")]
    pins = read_pins(reqs)
    problems = 0
    for n, v in pins.items():
        if bundle.get(n) is None or Version(bundle[n]) != Version(v):
            print(f"  NOT INSTALLED  {n}=={v} (found {bundle.get(n)})"); problems += 1
    skips, accepted = read_skips(reqs), []
    for n, reqlist in sorted(metas.items()):
        for r in reqlist:
            req = Requirement(r)
            if req.marker and not req.marker.evaluate(env):
                continue
            k = cn(req.name)
            have = bundle.get(k) or (image.get(k) if k in image else None)
            if k in bundle or k in image:
                if have and not req.specifier.contains(Version(have), prereleases=True):
                    # the bundle shadows the image (PYTHONPATH first), so only a bundle/bundle clash matters
                    where = "bundle" if k in bundle else "image"
                    print(f"  CONFLICT  {n}: {r}  ({where} has {have})"); problems += 1
                continue
            if k in skips:
                accepted.append(f"{n} -> {r}")
            else:
                print(f"  UNMET     {n}: {r}"); problems += 1
    print(f"  {len(bundle)} dists installed; {len(accepted)} unmet requirements accepted (# skip:):")
    for a in accepted:
        print(f"    skip  {a}")
    sys.exit(1 if problems else 0)

if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1]](*sys.argv[2:])
PYEOF

"$PY" -c 'import packaging' 2>/dev/null || { echo "build_bundle: python3 needs 'packaging'" >&2; exit 1; }

# 1. download missing pinned wheels (one pip call)
mapfile -t MISSING < <("$PY" "$TOOL" missing "$REQS" "$CACHE")
if ((${#MISSING[@]})); then
  echo "[1/5] downloading ${#MISSING[@]} wheel(s) into $CACHE"
  "$PY" -m pip download -q --no-deps "${TARGET_FLAGS[@]}" -d "$CACHE" "${MISSING[@]}"
else
  echo "[1/5] all pinned wheels cached"
fi

# 2. strip + re-zip uncompressed
echo "[2/5] processing wheels into $SLIM"
"$PY" "$TOOL" process "$REQS" "$CACHE" "$SLIM"

# 3. tar.xz
FP="$("$PY" "$TOOL" fingerprint "$SLIM") max=$MAX_BYTES xz-9"
if [[ -f $TARBALL && -f $BUNDLE/.tarball.fp && "$(cat "$BUNDLE/.tarball.fp")" == "$FP" ]]; then
  echo "[3/5] $TARBALL up to date"
else
  echo "[3/5] packing $TARBALL (xz -9, takes a few minutes on 2 cores)"
  STAGE=$(mktemp -d "$BUNDLE/stage.XXXXXX")
  mkdir "$STAGE/sglang-gpu"
  ln "$SLIM"/*.whl "$STAGE/sglang-gpu/" 2>/dev/null || cp "$SLIM"/*.whl "$STAGE/sglang-gpu/"
  tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - sglang-gpu \
    | xz -9 -T2 -c >"$TARBALL.tmp"
  rm -rf "$STAGE"
  mv "$TARBALL.tmp" "$TARBALL"
  echo "$FP" >"$BUNDLE/.tarball.fp"
fi
SIZE=$(stat -c %s "$TARBALL")
if ((SIZE > MAX_BYTES)); then
  echo "build_bundle: $TARBALL is $SIZE bytes > $MAX_BYTES" >&2
  exit 1
fi

# 4. manifest
"$PY" "$TOOL" manifest "$SLIM" "$TARBALL" "$MANIFEST"
echo "[4/5] $MANIFEST: $(grep -c '\.whl$' "$MANIFEST") wheels, tarball $((SIZE / 1000000)).$(((SIZE / 10000) % 100)) MB"

# 5. CPU-side smoke check: install for the cp312 target into a scratch dir, check Requires-Dist
if ((DO_CHECK)); then
  if [[ -f $CHECK_DIR/.bundle.fp && "$(cat "$CHECK_DIR/.bundle.fp")" == "$FP" ]]; then
    echo "[5/5] $CHECK_DIR up to date; Requires-Dist check"
  else
    echo "[5/5] pip install --target $CHECK_DIR (cp312 tags) + Requires-Dist check"
    rm -rf "$CHECK_DIR"
    "$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
      "${TARGET_FLAGS[@]}" --target "$CHECK_DIR" "$SLIM"/*.whl
    echo "$FP" >"$CHECK_DIR/.bundle.fp"
  fi
  "$PY" "$TOOL" check "$CHECK_DIR" "$REQS"
else
  echo "[5/5] check skipped"
fi
echo "done: $TARBALL"
