// How long compiles took, in fixed buckets counted lock-free by the workers: the one record of
// compile time, read whole by the Stats RPC (count, sum) and the metrics endpoint (buckets).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace kiln::daemon {

class LatencyHistogram {
 public:
  // Upper bounds of the buckets in seconds, inclusive: from a cached-toolchain CPU kernel
  // (10 ms) to the longest compiles seen (minutes). Longer samples count only in the total.
  static constexpr std::array<double, 14> kBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                     2.5,  5,     10,   30,  60,   120, 300};

  struct Snapshot {
    uint64_t count = 0;       // Samples, the sum of every bucket (so never behind them).
    uint64_t sum_micros = 0;  // Their total.
    std::array<uint64_t, kBounds.size()> cumulative{};  // Samples <= kBounds[i].
  };

  void Record(std::chrono::microseconds elapsed);
  // Each counter is read atomically; a sample recorded meanwhile may be in some and not others.
  Snapshot Read() const;

 private:
  // One per bound, then one for the samples above every bound.
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_micros_{0};
};

}  // namespace kiln::daemon
