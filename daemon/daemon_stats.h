// The daemon's counters, updated lock-free from handlers and workers and read by Stats.
#pragma once

#include <atomic>
#include <cstdint>

namespace kiln::daemon {

struct DaemonStats {
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> compiles{0};
  std::atomic<uint64_t> compile_errors{0};
  std::atomic<uint64_t> compile_micros{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> waiting{0};  // calls blocked on a flight now
};

}  // namespace kiln::daemon
