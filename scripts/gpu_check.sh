#!/usr/bin/env bash
# On a machine with only CPython, torch and a compiler (the GPU machine): build kiln._C with the
# system python3, run the Python tests, then the benchmarks on CUDA when a GPU is present.
# Usage: scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-gpu/out}
mkdir -p "$out"
cd "$root"
py=${KILN_PYTHON:-python3}
if [ -d .whl ]; then  # wheels carried for packages the machine lacks
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/kiln-site .whl/*.whl
  export PYTHONPATH=/tmp/kiln-site${PYTHONPATH:+:$PYTHONPATH}
fi
$py -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
cmake -S . -B build-gpu -DPython_EXECUTABLE="$(command -v $py)" -DKILN_BUILD_DAEMON=OFF \
  -DKILN_BUILD_TESTS=OFF >/dev/null && cmake --build build-gpu -j"$(nproc)" 2>&1 | tail -3
export PYTHONPATH=$root/client/python${PYTHONPATH:+:$PYTHONPATH}
status=0
$py -m pytest -q -p no:cacheprovider tests/python 2>&1 | tee "$out/pytest.txt" | tail -25 || status=1
if [ "${KILN_GPU_BENCH:-1}" = 1 ]; then
  $py bench/bench_overhead.py --out "$out/bench.jsonl"
  if $py -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    $py bench/bench_capture.py --device cuda --out "$out/bench.jsonl"
  fi
fi
exit $status
