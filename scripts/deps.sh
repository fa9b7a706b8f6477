#!/usr/bin/env bash
# The Python dependencies beyond the lock: an environment with the newest versions that
# requirements.txt allows, to see a new release of transformers, timm, grpcio... here first.
#
#   scripts/deps.sh latest [pytest args]   .venv-latest with the newest versions; runs the Python
#                                          suite there (`make test-latest`); exits as pytest does
#   scripts/deps.sh lock                   the same environment, then requirements.lock rewritten
#                                          from it: every package at the version installed
#
# torch and torchvision stay at requirements.txt's exact pins (the machine's wheel): kiln._C and
# kilnd are built against that torch, and a new torch is a change of kiln's own, not a dependency
# moving under it. Needs `make setup` first (the build and the generated kiln.v1 modules, which
# both environments share).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[deps] %s\n' "$*" >&2; }
mode=${1:-}
case "$mode" in
  latest | lock) shift ;;
  *) echo "usage: scripts/deps.sh latest [pytest args] | lock" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ] || [ ! -d client/python/kiln/v1 ]; then
  log "run 'make setup' first"
  exit 2
fi

py=${KILN_PYTHON:-python3}
env=.venv-latest
if [ ! -x "$env/bin/python" ]; then
  log "creating $env with $($py --version)"
  "$py" -m venv "$env"
fi
quiet() { grep -v "WARNING: Location" >&2 || true; }  # this machine's index lists absent folders
"$env/bin/python" -m pip install -q --upgrade pip setuptools 2> >(quiet)
log "installing the newest versions requirements.txt allows"
"$env/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -r requirements.txt \
  2> >(quiet)
site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/client/python" > "$site/kiln-dev.pth"
. scripts/venv.sh
kiln_dist_info "$site"

freeze() { "$1/bin/python" -m pip freeze --all --exclude-editable 2>/dev/null | sort -f; }
if [ "$mode" = lock ]; then
  {
    echo "# Every Python package kiln's tests run with, at the version they ran with: the constraints"
    echo "# scripts/setup.sh installs requirements.txt under. Written by scripts/deps.sh lock from the"
    echo "# newest versions requirements.txt allows; do not edit by hand."
    freeze "$env"
  } > requirements.lock
  log "requirements.lock written ($(grep -vc '^#' requirements.lock) packages); run make test"
  exit 0
fi

# What moved since the lock: the versions this run tests that the lock does not pin.
changed=$(comm -13 <(grep -v '^#' requirements.lock | sort -f) <(freeze "$env") || true)
if [ -n "$changed" ]; then
  log "newer than requirements.lock:"
  printf '  %s\n' $changed >&2
else
  log "the newest versions are the locked ones"
fi
PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$env/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
