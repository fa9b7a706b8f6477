#!/usr/bin/env bash
# The Python suite on CPython 3.12 on this machine, beside the 3.11 one `make test` runs: a
# second virtual environment (.venv312, requirements.txt under requirements.lock, the cp312 torch wheel), kiln._C
# built for it in build-py312/ (next to the 3.11 extension: the file names differ by ABI tag),
# the same kilnd. The 3.12 bytecode paths of the decoder and the executor run here without a
# GPU machine. Needs `make setup` first (kilnd and the generated kiln.v1 modules).
#
#   scripts/test_py312.sh [pytest args]      KILN_PY312=/path/to/python3.12 to choose one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[py312] %s\n' "$*" >&2; }

py=${KILN_PY312:-}
if [ -z "$py" ]; then
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$c" >/dev/null 2>&1; then py=$(command -v "$c"); break; fi
  done
fi
if [ -z "$py" ]; then
  log "no CPython 3.12 on this machine (set KILN_PY312): the 3.12 suite did not run"
  exit 2
fi
if [ ! -x .venv/bin/python ] || [ ! -d client/python/kiln/v1 ]; then
  log "run 'make setup' first"; exit 2
fi

# The lock's grpcio and protobuf are the 3.11 environment's: the generated kiln.v1 modules are
# shared by both.
. scripts/venv.sh
kiln_locked_venv .venv312 "$py"

if [ ! -f build-py312/CMakeCache.txt ]; then
  log "configuring build-py312/"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B build-py312 -DPython_EXECUTABLE="$root/.venv312/bin/python" -DKILN_BUILD_DAEMON=OFF \
    -DKILN_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
fi
log "building kiln._C for $(.venv312/bin/python --version)"
cmake --build build-py312 -j"${KILN_JOBS:-$(nproc)}" >/dev/null
PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" \
  .venv312/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"
