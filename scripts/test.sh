#!/usr/bin/env bash
# Every test: the GoogleTest suites through ctest, the bounded fuzz run (scripts/fuzz.sh), then
# pytest. Exits non-zero if any fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
if [ -n "$(ctest --test-dir build -N 2>/dev/null | grep -E '^  Test +#')" ]; then
  ctest --test-dir build --output-on-failure -j"$(nproc)" || status=1
fi
scripts/fuzz.sh || status=1
PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python || status=1
exit $status
