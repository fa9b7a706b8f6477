#!/usr/bin/env bash
# The digest of the sources a kilnd is built from (compiler/, daemon/, cache/, proto/: their C++,
# protos and CMake files), computed the same way on any machine that has the tree, git or not.
# scripts/kilnd_bundle.sh records it beside a kilnd it builds from the tree (SOURCES), and
# scripts/gpu_check.sh compares it with the tree it runs in: a bundle made before a change to
# those sources is refused there instead of running the old compiler.
# Usage: scripts/kilnd_sources.sh   (prints the sha256)
set -euo pipefail
cd "$(dirname "$0")/.."
find compiler daemon cache proto -type f \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' -o -name '*.proto' -o -name CMakeLists.txt \) \
  -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
