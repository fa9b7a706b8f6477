#!/usr/bin/env bash
# Brings a fresh machine to a built kiln: system packages, the virtual environment, the CMake build.
# Idempotent: each step is skipped when what it makes is already there and up to date.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[setup] %s\n' "$*" >&2; }

# 1. System packages (Debian): the toolchain parts of kilnd and its tests.
apt_pkgs=(build-essential cmake ccache pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler librocksdb-dev pybind11-dev libgtest-dev libgmock-dev libhiredis-dev redis-server
  libspdlog-dev libabsl-dev libssl-dev zlib1g-dev prometheus-cpp-dev clang-format
  clang libclang-rt-14-dev)  # scripts/fuzz.sh: clang, and libFuzzer (which clang only recommends)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing system packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The virtual environment: requirements.txt at the exact versions of requirements.lock,
# refreshed when either file changes (pip moves an installed package to its locked version).
# The package lives in the tree (client/python); the environment finds it through a .pth file, and
# torch.compile(backend="kiln") through the package's metadata beside it (kiln_dist_info).
. scripts/venv.sh
kiln_locked_venv .venv "${KILN_PYTHON:-python3}"

# 3. The build: kiln._C and, where its libraries exist, kilnd.
jobs=${KILN_JOBS:-$(nproc)}
if [ ! -f build/CMakeCache.txt ]; then
  log "configuring build/"
  cmake -S . -B build -DPython_EXECUTABLE="$root/.venv/bin/python" -DKILN_WERROR=${KILN_WERROR:-OFF} >/dev/null
fi
log "building (-j$jobs)"
cmake --build build -j"$jobs" 2>&1 | grep -E "error|warning:|Error" || true
cmake --build build -j"$jobs" >/dev/null

# 4. The kiln.v1 Python messages (client/python/kiln/v1, generated from proto/ when stale).
.venv/bin/python -c 'from kiln.daemon import protocol; protocol.ensure_generated()'
