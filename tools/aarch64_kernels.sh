#!/usr/bin/env bash
# Cross-compile miita-edge's native core for aarch64 (Raspberry Pi 4/5 class: ARMv8-A with NEON) with
# Debian's cross toolchain, together with the parts of ggml it needs (ggml-base, ggml-cpu: static), and
# run its kernel tests (tools/kernel_check.cpp) under qemu-user-static: LM-head rows in six types,
# the exact-R pass, top-k, the int8/1-bit recall scans, and the eval callback's key sum, capture and
# addition on a small graph computed by ggml's CPU backend. The rows are then compared on the host
# with gguf-py's dequantisation of the same bytes.
#
#   tools/aarch64_kernels.sh                      # installs g++-aarch64-linux-gnu + qemu-user-static if
#                                                 # missing (apt-get, as root), fetches ggml if needed
#   GGML_SRC=/path/to/ggml tools/aarch64_kernels.sh   # a ggml source tree (include/, src/, CMakeLists.txt)
#   MIITA_A64_MARCH=armv8.2-a+dotprod+fp16 ...    # Pi 5 (Cortex-A76); default armv8-a (Pi 4, Cortex-A72)
#
# ggml's source, in this order: $GGML_SRC; a copy cached in $MIITA_A64_WORK; the llama-cpp-python sdist
# that miita-edge pins (its vendor/llama.cpp/ggml, the very ggml the x86 wheel runs; from PyPI); a
# shallow clone of github.com/ggml-org/ggml. Exits non-zero on any failed check.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${MIITA_A64_WORK:-${TMPDIR:-/tmp}/miita-aarch64}"
MARCH="${MIITA_A64_MARCH:-armv8-a}"
PIN="$(sed -n 's/^PINNED_LLAMA_CPP_PYTHON = "\(.*\)"/\1/p' "$ROOT/python/miita_edge/runtime/abi.py")"
JOBS="${MIITA_A64_JOBS:-$(nproc)}"
mkdir -p "$WORK"
T0=$(date +%s)
say() { echo "aarch64_kernels: $*"; }

# 1. toolchain
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing g++-aarch64-linux-gnu qemu-user-static"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user-static >/dev/null
  else
    echo "aarch64_kernels: error: need aarch64-linux-gnu-g++ and qemu-aarch64-static (apt-get install g++-aarch64-linux-gnu qemu-user-static)" >&2
    exit 2
  fi
fi
if ! command -v cmake >/dev/null; then say "installing cmake (pip)"; python3 -m pip install -q cmake ninja; fi
GEN="Unix Makefiles"; command -v ninja >/dev/null && GEN=Ninja

# 2. ggml sources
SRC="${GGML_SRC:-}"
if [ -z "$SRC" ] && [ -f "$WORK/ggml-src/CMakeLists.txt" ]; then SRC="$WORK/ggml-src"; fi
if [ -z "$SRC" ]; then
  say "fetching the llama-cpp-python $PIN sdist (for its vendored ggml)"
  rm -rf "$WORK/ggml-src" "$WORK/sdist" && mkdir -p "$WORK/sdist"
  if python3 - "$PIN" "$WORK/sdist" <<'EOF'
import hashlib, json, sys, tarfile, urllib.request
# The package index's simple API (PEP 691, JSON), which pip itself reads: the registry is reachable
# where the rest of the web is not (PyPI's older /pypi/<name>/<version>/json API may be blocked).
pin, out = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
f = next(f for f in files if f["filename"] == f"llama_cpp_python-{pin}.tar.gz")
path = f"{out}/sdist.tar.gz"
urllib.request.urlretrieve(f["url"], path)
h = hashlib.sha256()
with open(path, "rb") as fh:
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
if h.hexdigest() != f["hashes"]["sha256"]:
    sys.exit(f"aarch64_kernels: sha256 mismatch for {f['filename']}")
with tarfile.open(path) as tf:
    members = [m for m in tf.getmembers() if "/vendor/llama.cpp/ggml/" in m.name]
    tf.extractall(out, members=members)
EOF
  then
    mv "$(find "$WORK/sdist" -type d -path '*vendor/llama.cpp/ggml' | head -1)" "$WORK/ggml-src"
  else
    say "the package index is not reachable; cloning github.com/ggml-org/ggml"
    git clone -q --depth 1 https://github.com/ggml-org/ggml "$WORK/ggml-src"
  fi
  SRC="$WORK/ggml-src"
fi
# The sdist's vendored ggml lacks ggml.pc.in (a pkg-config template that ggml's CMakeLists configures
# unconditionally); nothing here installs ggml, so an empty template serves.
[ -f "$SRC/ggml.pc.in" ] || : > "$SRC/ggml.pc.in"
say "ggml from $SRC; -march=$MARCH"

# 3. ggml-base + ggml-cpu for aarch64 (static, portable: GGML_NATIVE=OFF)
cat > "$WORK/toolchain.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_C_FLAGS_INIT "-march=$MARCH")
set(CMAKE_CXX_FLAGS_INIT "-march=$MARCH")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
EOF
B="$WORK/ggml-build-$MARCH"
T1=$(date +%s)
cmake -S "$SRC" -B "$B" -G "$GEN" -DCMAKE_TOOLCHAIN_FILE="$WORK/toolchain.cmake" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
  -DGGML_CCACHE=OFF -DLLAMA_BUILD_COMMON=OFF >"$WORK/cmake.log" 2>&1 || { tail -20 "$WORK/cmake.log"; exit 1; }
cmake --build "$B" -j "$JOBS" --target ggml-base ggml-cpu >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
LIBS="$(find "$B" -name 'libggml-cpu.a' | head -1) $(find "$B" -name 'libggml-base.a' | head -1)"
T2=$(date +%s)

# 4. the native core (every csrc/*.cpp but the pybind11 layer) + the test driver, static
mapfile -t CORE < <(ls "$ROOT"/csrc/*.cpp | grep -v '/bindings.cpp$')
aarch64-linux-gnu-g++ -std=c++17 -O3 -march="$MARCH" -fopenmp -Wall -Wextra -I"$ROOT/csrc" -I"$SRC/include" \
  "${CORE[@]}" "$ROOT/tools/kernel_check.cpp" $LIBS -static -o "$WORK/kernel_check"
T3=$(date +%s)

# 5. run under qemu, then the rows against gguf-py on the host
OUT="$WORK/out-$MARCH"
rm -rf "$OUT" && mkdir -p "$OUT"
say "running under $(qemu-aarch64-static --version | head -1)"
qemu-aarch64-static -cpu max "$WORK/kernel_check" "$OUT"
T4=$(date +%s)
if python3 -c "import gguf, numpy" 2>/dev/null; then
  python3 - "$OUT" <<'EOF'
import sys, numpy as np
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize
out, bad = sys.argv[1], 0
for name, q in (("f32", Q.F32), ("f16", Q.F16), ("bf16", Q.BF16), ("q8_0", Q.Q8_0), ("q4_K", Q.Q4_K), ("q6_K", Q.Q6_K)):
    raw = np.fromfile(f"{out}/W_{name}.bin", np.uint8)
    got = np.fromfile(f"{out}/rows_{name}.f32", np.float32).reshape(1024, 256)
    ref = (raw.view(np.float32) if q == Q.F32 else dequantize(raw.reshape(1024, -1), q)).reshape(1024, 256)
    e = float(np.abs(got - ref).max() / np.abs(ref).max())
    ok = e <= 1e-6
    bad += not ok
    print(f"{'ok' if ok else 'FAIL':4s} {'rows ' + name + ' vs gguf-py':28s} 1024 aarch64 rows vs gguf-py dequantisation on the host: max rel err {e:.1e}")
sys.exit(1 if bad else 0)
EOF
else
  say "python3 with gguf + numpy not found: the host-side comparison with gguf-py was skipped"
fi
T5=$(date +%s)
say "passed: ggml $((T2 - T1)) s, core + driver $((T3 - T2)) s, qemu run $((T4 - T3)) s, host check $((T5 - T4)) s, total $((T5 - T0)) s"
