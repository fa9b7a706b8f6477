// The daemon's counters, updated lock-free from handlers and workers and read by the Stats RPC
// and the metrics endpoint. Cache hits and misses are the cache's own (ArtifactCache::Stats).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "daemon/latency_histogram.h"

namespace kiln::daemon {

// The RPCs of kiln.v1.KilnService, counted as they arrive (refused ones included).
enum class Rpc { kCompile, kLookup, kStats, kHealth, kShutdown, kPutCaptures, kGetCaptures };
inline constexpr size_t kRpcCount = 7;

// Why a request was refused.
enum class Refusal {
  kUnauthenticated,  // No or wrong bearer token on a TCP call.
  kTooLarge,         // Above --max-request-bytes.
  kInvalid,          // Failed validation (IR, key, an empty Lookup).
  kFrozen,           // A miss on a frozen daemon, which never compiles.
  kQueueFull,        // No room in the compile queue.
};
inline constexpr size_t kRefusalCount = 5;

struct DaemonStats {
  LatencyHistogram compile_latency;  // One sample per compile run, failed ones included.
  std::atomic<uint64_t> compile_errors{0};
  std::atomic<uint64_t> waiting{0};  // calls blocked on a flight now
  // Keys that waited for another daemon's compile (it held their fleet lease), and those of them
  // served its artifact; the others were compiled here after all.
  std::atomic<uint64_t> shared_compile_waits{0};
  std::atomic<uint64_t> shared_compile_wait_hits{0};
  std::array<std::atomic<uint64_t>, kRpcCount> requests{};
  std::array<std::atomic<uint64_t>, kRefusalCount> refused{};

  void Count(Rpc rpc) { ++requests[static_cast<size_t>(rpc)]; }
  void Refuse(Refusal why) { ++refused[static_cast<size_t>(why)]; }
  uint64_t refused_total() const {
    uint64_t total = 0;
    for (const auto& count : refused) total += count.load();
    return total;
  }
};

}  // namespace kiln::daemon
