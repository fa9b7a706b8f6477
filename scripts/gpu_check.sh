#!/usr/bin/env bash
# On a machine with only CPython, torch and a compiler (the GPU machine): build kiln._C with the
# system python3, run the Python tests, then the benchmarks on CUDA when a GPU is present.
# Usage: scripts/gpu_check.sh [OUT_DIR] [-- COMMAND...]
# With a COMMAND, it runs that (in the same environment: carried wheels, kilnd, the built
# extension) instead of the tests and benchmarks, e.g.
#   scripts/gpu_check.sh $OUT -- python3 bench/bench_warm_start.py --threads 16
# What that machine lacks comes from scripts/gpu_bundle.sh, run beforehand on the development
# machine, and is carried with the checkout: .whl (wheels: tabulate, and the grpcio and protobuf
# the kiln.v1 modules were generated for, installed ahead of the machine's own), .kilnd-bundle
# (kilnd with its libraries; $KILN_KILND points at it) and client/python/kiln/v1. For instance:
#   run(command="scripts/gpu_check.sh", carry=[".whl", ".kilnd-bundle", "client/python/kiln/v1"])
# Without them the tests of the "kiln" backend skip. KILN_TEST_PROCESSES=N runs the Python tests
# in N processes at once (one process does not finish the suite within a 10-minute call on an
# H200 machine; 4 took 9.9 minutes with the suite of 2,370 tests, the slowest of them 8.6: use 6).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-gpu/out}
shift || true
command=()
if [ "${1:-}" = "--" ]; then
  shift
  command=("$@")
fi
mkdir -p "$out"
cd "$root"
py=${KILN_PYTHON:-python3}
if [ -d .whl ]; then  # wheels carried for packages the machine lacks or has at other versions
  rm -rf /tmp/kiln-site
  wheels=(.whl/*.whl)
  if ! $py -c 'import typing_extensions' 2>/dev/null; then wheels+=(.whl/if-missing/*.whl); fi
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/kiln-site "${wheels[@]}"
  # First on sys.path: the carried grpcio and protobuf shadow the machine's.
  export PYTHONPATH=/tmp/kiln-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${KILN_KILND:-}" ] && [ -x .kilnd-bundle/kilnd ]; then
  # A bundle made before the tree's compiler or daemon changed would build the old kernels and
  # plans: refused (KILN_ALLOW_STALE_KILND=1 runs it anyway), rerun scripts/gpu_bundle.sh.
  if [ -f .kilnd-bundle/SOURCES ] && \
      [ "$(cat .kilnd-bundle/SOURCES)" != "$(scripts/kilnd_sources.sh)" ]; then
    if [ "${KILN_ALLOW_STALE_KILND:-0}" != 1 ]; then
      echo "kilnd: .kilnd-bundle was built from other sources than this tree's compiler/," \
        "daemon/, cache/ and proto/: rerun scripts/gpu_bundle.sh" >&2
      exit 1
    fi
    echo "kilnd: .kilnd-bundle is stale (KILN_ALLOW_STALE_KILND=1: running it anyway)"
  fi
  export KILN_KILND=$root/.kilnd-bundle/kilnd
fi
$py -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
cmake -S . -B build-gpu -DPython_EXECUTABLE="$(command -v $py)" -DKILN_BUILD_DAEMON=OFF \
  -DKILN_BUILD_TESTS=OFF >/dev/null && cmake --build build-gpu -j"$(nproc)" 2>&1 | tail -3
# The package's metadata (scripts/venv.sh) beside it on the path: torch.compile(backend="kiln")
# finds kiln through its entry point.
. scripts/venv.sh
kiln_dist_info "$root/build-gpu/site"
export PYTHONPATH=$root/client/python:$root/build-gpu/site${PYTHONPATH:+:$PYTHONPATH}

# Compiled bytecode for every module the tests and benchmarks import, as an installed package
# has it (pip compiles what it installs): kiln's package, the carried wheels, torch and what the
# models import, written beside the sources, and Python's default of writing the rest as it is
# imported. Without it (PYTHONDONTWRITEBYTECODE set, an image installed without bytecode) each
# process compiles those sources again: hundreds of ms for kiln and grpc, seconds for
# torch._dynamo and sympy, inside every first call that kiln or torch.compile makes.
unset PYTHONDONTWRITEBYTECODE
precompile=("$root/client/python/kiln")
[ -d /tmp/kiln-site ] && precompile+=(/tmp/kiln-site)
while read -r dir; do precompile+=("$dir"); done < <($py - <<'PY'
import importlib.util
for name in ("torch", "torchvision", "transformers", "sympy", "triton", "numpy", "mpmath",
             "networkx", "jinja2", "timm", "safetensors", "huggingface_hub", "tokenizers"):
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        print(list(spec.submodule_search_locations)[0])
PY
)
start=$(date +%s)
# (Files it cannot compile, sources for another Python version among them, are skipped.)
$py -m compileall -q -j0 "${precompile[@]}" >/dev/null 2>&1
echo "bytecode: ${#precompile[@]} packages compiled in $(( $(date +%s) - start )) s"

# The "kiln" backend's prerequisites, each said once, so that a skip or an eager fallback in the
# tests below has its cause printed here.
$py - <<'EOF'
import os
for mod in ("grpc", "google.protobuf", "tabulate"):
    try:
        m = __import__(mod, fromlist=["_"])
        print(f"{mod} {getattr(m, '__version__', '?')} from {os.path.dirname(m.__file__)}")
    except ImportError as e:
        print(f"{mod}: missing ({e})")
from importlib.metadata import entry_points
found = [ep.value for ep in entry_points(group="torch_dynamo_backends") if ep.name == "kiln"]
print("torch.compile backend 'kiln':", found[0] if found else "MISSING (no kiln metadata)")
from kiln.daemon import protocol
try:
    protocol.messages()
    print("kiln.v1: ok")
except protocol.ProtocolUnavailable as e:
    print(f"kiln.v1: UNAVAILABLE, the kiln backend's tests skip: {e}")
EOF
if [ -n "${KILN_KILND:-}" ]; then
  if kilnd_err=$("$KILN_KILND" --help 2>&1 >/dev/null); then
    echo "kilnd: $KILN_KILND"
  else
    echo "kilnd: $KILN_KILND does not run, the kiln backend's tests fail: $kilnd_err"
  fi
else
  echo "kilnd: none (no .kilnd-bundle, KILN_KILND unset), the kiln backend's tests skip"
fi
# kilnd builds kernels with $KILN_CXX (default g++) and the flags of compiler/toolchain/toolchain.cc
# (Toolchain::Flags and Libraries, copied here): -fopenmp-simd for the `omp simd` pragmas (no
# OpenMP runtime), GCC's simd attribute on libm's functions and -lmvec, glibc's vector math
# library (libc6-dev on Debian and Ubuntu). Build and load such a kernel for the ISA the client
# asks for, and name the flag that breaks when one does.
if [ -z "${KILN_CXX:-}" ] && ! command -v g++ >/dev/null && command -v c++ >/dev/null; then
  export KILN_CXX=c++
fi
cxx=${KILN_CXX:-g++}
isa=$($py -c 'from kiln.daemon.artifact import cpu_isa; print(cpu_isa() or "")' 2>/dev/null)
probe=$(mktemp -d)
cat >"$probe/k.cc" <<'EOF'
#include <cmath>
#include <cstdint>
#if defined(__x86_64__) && defined(__GLIBC__)
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float);
__attribute__((simd("notinbranch"))) float tanhf(float);
__attribute__((simd("notinbranch"))) float erff(float);
}
#endif
extern "C" void kiln_probe(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = expf(x[i]) + tanhf(x[i]) + erff(x[i]);
}
EOF
flags=(-O3 "-march=${isa:-x86-64}" -mtune=generic -fopenmp-simd -fPIC -shared -fno-math-errno
  -fno-trapping-math -std=c++17 -w)
libs=(-lm)
case "$isa" in x86-64*) libs=(-lmvec -lm) ;; esac
if ! command -v "$cxx" >/dev/null; then
  echo "compiler: no $cxx on PATH (set KILN_CXX): kilnd compiles nothing, kiln runs eagerly"
elif "$cxx" "${flags[@]}" -o "$probe/k.so" "$probe/k.cc" "${libs[@]}" 2>"$probe/err"; then
  $py - "$probe/k.so" "$cxx" "${isa:-x86-64}" <<'EOF'
import ctypes, math, sys
lib = ctypes.CDLL(sys.argv[1])
n = 64
x = (ctypes.c_float * n)(*[i / 16 - 2 for i in range(n)])
y = (ctypes.c_float * n)()
lib.kiln_probe(x, y, ctypes.c_int64(n))
err = max(abs(y[i] - (math.exp(x[i]) + math.tanh(x[i]) + math.erf(x[i]))) for i in range(n))
vec = b"_ZGV" in open(sys.argv[1], "rb").read()
print(f"compiler: {sys.argv[2]} builds and loads kernels for {sys.argv[3]}"
      f" ({'libmvec' if vec else 'scalar libm'}, max error {err:.1e})")
sys.exit(0 if err < 1e-4 else 1)
EOF
  [ $? = 0 ] || echo "compiler: the probe kernel built by $cxx computes wrong values"
else
  why=$(head -3 "$probe/err")
  if ! echo 'int main(){}' | "$cxx" -x c++ -fopenmp-simd -o /dev/null - 2>/dev/null; then
    why="$cxx does not accept -fopenmp-simd (an OpenMP-capable g++ is needed)"
  elif ! echo 'int main(){}' | "$cxx" -x c++ -o /dev/null - -lmvec 2>/dev/null; then
    why="no libmvec to link (-lmvec: glibc's libc6-dev); KILN_CPU_ISA cannot help, x86-64 needs it"
  elif ! "$cxx" "${flags[@]/-march=*/-march=x86-64}" -o "$probe/k.so" "$probe/k.cc" \
      "${libs[@]}" 2>/dev/null; then
    why="$cxx cannot build the kernel even for x86-64: $(head -3 "$probe/err")"
  else
    why="$cxx does not know -march=$isa (KILN_CPU_ISA=x86-64 avoids it)"
  fi
  echo "compiler: kernels do not build, kilnd's compiles fail and kiln runs eagerly: $why"
fi
rm -rf "$probe"

if [ ${#command[@]} -gt 0 ]; then
  "${command[@]}"
  exit $?
fi
status=0
procs=${KILN_TEST_PROCESSES:-1}
if [ "$procs" -gt 1 ]; then
  # The suite in $procs pytest processes at once (one process takes longer on the GPU machine
  # than one call to it may run): test files dealt round-robin, each process with its own kilnd
  # (cache and socket directory) and its own basetemp; each one's output in $out/pytest<i>.txt.
  files=(tests/python/test_*.py)
  pids=()
  for i in $(seq 0 $((procs - 1))); do
    mine=()
    for j in "${!files[@]}"; do [ $((j % procs)) = "$i" ] && mine+=("${files[$j]}"); done
    dir=$(mktemp -d)
    mkdir -p "$dir/cache" "$dir/run" && chmod 700 "$dir/run"
    env -u KILN_CACHE_DIR XDG_CACHE_HOME="$dir/cache" XDG_RUNTIME_DIR="$dir/run" \
      $py -m pytest -q -p no:cacheprovider -rfE --basetemp="$dir/tmp" "${mine[@]}" \
      >"$out/pytest$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== pytest process $i of $procs"
    grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|error)" "$out/pytest$i.txt" | tail -15
  done
else
  $py -m pytest -q -p no:cacheprovider tests/python 2>&1 | tee "$out/pytest.txt" | tail -25 ||
    status=1
fi
if [ "${KILN_GPU_BENCH:-1}" = 1 ]; then
  $py bench/bench_overhead.py --out "$out/bench.jsonl"
  if $py -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    $py bench/bench_capture.py --device cuda --out "$out/bench.jsonl"
  fi
fi
exit $status
