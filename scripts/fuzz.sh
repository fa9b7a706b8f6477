#!/usr/bin/env bash
# Builds the libFuzzer targets in build-fuzz/ (clang, ASan and UBSan, ccache) and fuzzes each for
# a bounded time: fuzz_compile_request (request decoding, validation and the cache key),
# fuzz_compile (valid requests through the CPU compiler up to the host compiler) and
# fuzz_plan_decoder (the client's ExecutionPlan decoder against libprotobuf). Exits non-zero
# on a crash, naming the reproducer, and when it cannot run at all (no clang, no libFuzzer): a
# fuzz run that silently did nothing would read as a pass.
#
#   KILN_FUZZ_SECONDS   how long to fuzz each target (default 45)
#   KILN_FUZZ_REQUIRED  0: a machine without clang skips (exit 0, with a message) instead of failing
#   KILN_JOBS           build parallelism (default: every core)
#   KILN_FUZZ_CC/_CXX   the clang to use (default clang, clang++)
# The build reuses objects across runs (incremental, and ccache via the root CMakeLists.txt).
# Extra arguments go to libFuzzer. To replay a reproducer:
#   build-fuzz/tests/fuzz/<target> <file>
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[fuzz] %s\n' "$*" >&2; }

seconds=${KILN_FUZZ_SECONDS:-45}
required=${KILN_FUZZ_REQUIRED:-1}
cc=${KILN_FUZZ_CC:-clang}
cxx=${KILN_FUZZ_CXX:-clang++}

if ! command -v "$cxx" >/dev/null || ! command -v "$cc" >/dev/null; then
  if [ "$required" = 0 ]; then
    log "skipped: $cxx not found and KILN_FUZZ_REQUIRED=0 (scripts/setup.sh installs clang)"
    exit 0
  fi
  log "FAILED: $cxx not found: the fuzzers cannot run (install clang libclang-rt-14-dev, as"
  log "        scripts/setup.sh does; KILN_FUZZ_REQUIRED=0 turns this into a skip)"
  exit 1
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
targets=(fuzz_compile_request fuzz_compile fuzz_plan_decoder)
if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -40 >&2
  log "FAILED: building $build/ (full log: $build/build.log)"
  exit 1
fi

# Each target's corpus grows across runs (build-fuzz/corpus/<target>); the seeds are read, never
# written.
status=0
for target in "${targets[@]}"; do
  fuzzer=$build/tests/fuzz/$target
  corpus=$build/corpus/$target
  crashes=$build/crashes/$target
  mkdir -p "$corpus" "$crashes"
  rm -f "$crashes"/*
  fuzz_log=$build/$target.log
  "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict=tests/fuzz/fuzz_compile_request.dict -artifact_prefix="$crashes/" "$@" \
    "$corpus" "$build/tests/fuzz/seeds" \
    >"$fuzz_log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 60 "$fuzz_log" >&2
    log "FAILED: $target exited with $rc (full log: $fuzz_log)"
    for crash in "$crashes"/*; do
      [ -e "$crash" ] && log "reproducer: $crash   (replay: $fuzzer $crash)"
    done
    status=1
    continue
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$fuzz_log")
  if [ -z "$runs" ] || [ "$runs" = 0 ]; then
    log "FAILED: $target ran no input (log: $fuzz_log)"
    status=1
    continue
  fi
  log "ok: $target: $runs inputs in ${seconds}s, no crash ($(ls "$corpus" | wc -l) in corpus)"
done
exit $status
