// kilnd's Prometheus metrics: their names, help and types, and which of the daemon's own counters
// each one reads. Nothing is counted here, so a scrape and the Stats RPC never disagree.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

#include "cache/artifact_cache.h"
#include "cache/artifact_store.h"
#include "cache/capture_records.h"
#include "daemon/daemon_stats.h"
#include "daemon/worker_pool.h"

namespace kiln::daemon {

// Where the numbers live. Each must outlive the metrics and every scrape of them.
struct MetricsSources {
  const DaemonStats* stats;
  const WorkerPool* pool;
  const cache::ArtifactCache* cache;
  const cache::ArtifactStore* store;
  const cache::CaptureRecords* captures;      // stored-capture records
  const cache::ArtifactStore* capture_store;  // and the store they live in
};

// A prometheus-cpp Collectable that reads its sources afresh on every scrape:
//   kiln_cache_hits_total{tier}, kiln_cache_misses_total{tier}  tier="local"|"shared"
//   kiln_compiles_total, kiln_compile_errors_total, kiln_compile_duration_seconds (histogram)
//   kiln_compile_queue_depth, kiln_compiles_in_flight, kiln_compile_waiting_requests
//   kiln_shared_compile_waits_total, kiln_shared_compile_wait_hits_total
//   kiln_store_bytes, kiln_store_entries, kiln_store_evictions_total
//   kiln_requests_total{rpc}, kiln_requests_refused_total{reason}
//   kiln_capture_records, kiln_capture_hits_total, kiln_capture_puts_total,
//   kiln_capture_rejected_total
// Thread-safe: scrapes run on the HTTP server's threads while the daemon serves.
class DaemonMetrics final : public prometheus::Collectable {
 public:
  explicit DaemonMetrics(MetricsSources sources) : sources_(sources) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const MetricsSources sources_;
};

}  // namespace kiln::daemon
