// LatencyHistogram: a bucket index by binary search, relaxed atomic counts.
#include "daemon/latency_histogram.h"

#include <algorithm>

namespace kiln::daemon {

void LatencyHistogram::Record(std::chrono::microseconds elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  // The first bound >= seconds: Prometheus buckets include their upper bound.
  const size_t bucket = std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(elapsed.count()), std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot snapshot;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    snapshot.count += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) snapshot.cumulative[i] = snapshot.count;
  }
  snapshot.sum_micros = sum_micros_.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace kiln::daemon
