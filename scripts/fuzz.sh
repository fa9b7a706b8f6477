#!/usr/bin/env bash
# Builds the libFuzzer target for request decoding and validation in build-fuzz/ (clang, ASan and
# UBSan, ccache) and fuzzes it for a bounded time. Exits non-zero on a crash, naming the reproducer.
#
#   KILN_FUZZ_SECONDS   how long to fuzz (default 60)
#   KILN_FUZZ_REQUIRED  when set (not 0), a machine without clang is a failure, not a skip
#   KILN_JOBS           build parallelism (default: every core)
#   KILN_FUZZ_CC/_CXX   the clang to use (default clang, clang++)
# The build reuses objects across runs (incremental, and ccache via the root CMakeLists.txt).
# Extra arguments go to libFuzzer. To replay a reproducer:
#   build-fuzz/tests/fuzz/fuzz_compile_request <file>
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[fuzz] %s\n' "$*" >&2; }

seconds=${KILN_FUZZ_SECONDS:-60}
required=${KILN_FUZZ_REQUIRED:-}
[ "$required" = 0 ] && required=""
cc=${KILN_FUZZ_CC:-clang}
cxx=${KILN_FUZZ_CXX:-clang++}

if ! command -v "$cxx" >/dev/null || ! command -v "$cc" >/dev/null; then
  if [ -n "$required" ]; then
    log "FAILED: $cxx not found and KILN_FUZZ_REQUIRED is set (install clang libclang-rt-14-dev)"
    exit 1
  fi
  log "skipped: $cxx not found (scripts/setup.sh installs clang; KILN_FUZZ_REQUIRED=1 makes this fail)"
  exit 0
fi
# Debian's clang only recommends its runtime libraries, libFuzzer among them.
runtime_dir=$("$cxx" -print-runtime-dir 2>/dev/null)
if [ ! -f "$runtime_dir/libclang_rt.fuzzer-$(uname -m).a" ]; then
  log "FAILED: $cxx has no libFuzzer runtime in $runtime_dir (install libclang-rt-14-dev)"
  exit 1
fi

# Every object in build-fuzz/ gets the coverage hooks and sanitizers, so the kiln libraries the
# target links are instrumented too; only the fuzz target itself links libFuzzer's main.
# -O1 and line tables: the usual fuzzing trade of speed against build time and readable traces.
# gRPC, protobuf, absl and RocksDB are Debian's gcc-built shared libraries; ASan works with them
# uninstrumented (it intercepts malloc), it just cannot see overflows inside them.
sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
jobs=${KILN_JOBS:-$(nproc)}
build=build-fuzz
mkdir -p "$build"
# Configuring again with unchanged arguments keeps every object; it also picks up new seeds.
if ! cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
    -DKILN_BUILD_CLIENT=OFF -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_FUZZERS=ON \
    >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  log "FAILED: configuring $build/"
  exit 1
fi
if ! cmake --build "$build" -j"$jobs" --target fuzz_compile_request >"$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -40 >&2
  log "FAILED: building $build/ (full log: $build/build.log)"
  exit 1
fi

# The corpus grows across runs (build-fuzz/corpus); the seeds are read, never written.
fuzzer=$build/tests/fuzz/fuzz_compile_request
mkdir -p "$build/corpus" "$build/crashes"
rm -f "$build"/crashes/*
fuzz_log=$build/fuzz.log
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict=tests/fuzz/fuzz_compile_request.dict -artifact_prefix="$build/crashes/" "$@" \
  "$build/corpus" "$build/tests/fuzz/seeds" \
  >"$fuzz_log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 60 "$fuzz_log" >&2
  log "FAILED: fuzz_compile_request exited with $rc (full log: $fuzz_log)"
  for crash in "$build"/crashes/*; do
    [ -e "$crash" ] && log "reproducer: $crash   (replay: $fuzzer $crash)"
  done
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$fuzz_log")
log "ok: ${runs:-?} inputs in ${seconds}s, no crash ($(ls "$build/corpus" | wc -l) in corpus)"
