// DaemonMetrics: one MetricFamily per metric, built from a snapshot of each source.
#include "daemon/metrics.h"

#include <array>
#include <limits>
#include <string>
#include <string_view>

namespace kiln::daemon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Label values, in the order of the enums in daemon_stats.h.
constexpr std::array<std::string_view, kRpcCount> kRpcNames = {
    "Compile", "Lookup", "Stats", "Health", "Shutdown", "PutCaptures", "GetCaptures"};
constexpr std::array<std::string_view, kRefusalCount> kRefusalNames = {
    "unauthenticated", "too_large", "invalid", "frozen", "queue_full"};

ClientMetric Sample(MetricType type, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

MetricFamily Single(std::string name, std::string help, MetricType type, double value) {
  return MetricFamily{std::move(name), std::move(help), type, {Sample(type, value)}};
}

// A counter with one sample per label value; `counts[i]` goes with `names[i]`.
template <size_t N>
MetricFamily Labelled(std::string name, std::string help, std::string label,
                      const std::array<std::string_view, N>& names,
                      const std::array<uint64_t, N>& counts) {
  MetricFamily family{std::move(name), std::move(help), MetricType::Counter, {}};
  for (size_t i = 0; i < N; ++i) {
    family.metric.push_back(
        Sample(MetricType::Counter, counts[i], {{label, std::string(names[i])}}));
  }
  return family;
}

template <size_t N>
std::array<uint64_t, N> Load(const std::array<std::atomic<uint64_t>, N>& counters) {
  std::array<uint64_t, N> values{};
  for (size_t i = 0; i < N; ++i) values[i] = counters[i].load();
  return values;
}

MetricFamily CompileDuration(const LatencyHistogram::Snapshot& compiles) {
  ClientMetric metric;
  metric.histogram.sample_count = compiles.count;
  metric.histogram.sample_sum = compiles.sum_micros / 1e6;
  for (size_t i = 0; i < LatencyHistogram::kBounds.size(); ++i) {
    metric.histogram.bucket.push_back({compiles.cumulative[i], LatencyHistogram::kBounds[i]});
  }
  metric.histogram.bucket.push_back({compiles.count, std::numeric_limits<double>::infinity()});
  return MetricFamily{"kiln_compile_duration_seconds",
                      "Time each compile took, failed ones included.",
                      MetricType::Histogram,
                      {std::move(metric)}};
}

}  // namespace

std::vector<MetricFamily> DaemonMetrics::Collect() const {
  const cache::ArtifactCacheStats lookups = sources_.cache->Stats();
  const cache::ArtifactStoreStats store = sources_.store->Stats();
  const LatencyHistogram::Snapshot compiles = sources_.stats->compile_latency.Read();
  constexpr std::array<std::string_view, 2> kTiers = {"local", "shared"};
  std::vector<MetricFamily> families;
  families.push_back(Labelled("kiln_cache_hits_total",
                              "Compile and Lookup requests served by a cache tier.", "tier", kTiers,
                              std::array<uint64_t, 2>{lookups.local_hits, lookups.remote_hits}));
  families.push_back(Labelled(
      "kiln_cache_misses_total",
      "Compile and Lookup requests a cache tier could not serve (a local miss goes on to the "
      "shared tier when there is one).",
      "tier", kTiers, std::array<uint64_t, 2>{lookups.local_misses(), lookups.remote_misses}));
  families.push_back(Single("kiln_compiles_total", "Compiles run (one per key however many ask).",
                            MetricType::Counter, compiles.count));
  families.push_back(Single("kiln_compile_errors_total", "Compiles that returned a CompileError.",
                            MetricType::Counter, sources_.stats->compile_errors.load()));
  families.push_back(CompileDuration(compiles));
  families.push_back(Single("kiln_compile_queue_depth", "Compiles waiting for a worker.",
                            MetricType::Gauge, sources_.pool->queue_depth()));
  families.push_back(Single("kiln_compiles_in_flight", "Compiles running on a worker.",
                            MetricType::Gauge, sources_.pool->running()));
  families.push_back(Single("kiln_compile_waiting_requests",
                            "Compile requests waiting for a compile to finish.", MetricType::Gauge,
                            sources_.stats->waiting.load()));
  families.push_back(Single("kiln_shared_compile_waits_total",
                            "Keys that waited for another kilnd's compile (it held their lease in "
                            "the shared tier) instead of compiling.",
                            MetricType::Counter, sources_.stats->shared_compile_waits.load()));
  families.push_back(Single("kiln_shared_compile_wait_hits_total",
                            "Waits for another kilnd's compile that ended with its artifact (the "
                            "others compiled here after all).",
                            MetricType::Counter, sources_.stats->shared_compile_wait_hits.load()));
  families.push_back(Single("kiln_store_bytes", "Bytes in the local artifact store.",
                            MetricType::Gauge, store.bytes));
  families.push_back(Single("kiln_store_entries", "Artifacts in the local artifact store.",
                            MetricType::Gauge, store.entries));
  families.push_back(Single("kiln_store_evictions_total",
                            "Artifacts evicted from the local store by its size limit.",
                            MetricType::Counter, store.evictions));
  const cache::CaptureRecordStats captures = sources_.captures->Stats();
  families.push_back(Single("kiln_capture_records", "Stored-capture records in the local store.",
                            MetricType::Gauge, sources_.capture_store->Stats().entries));
  families.push_back(Single("kiln_capture_hits_total",
                            "GetCaptures calls served a record (from either tier).",
                            MetricType::Counter, captures.gets));
  families.push_back(Single("kiln_capture_puts_total", "Stored-capture records stored.",
                            MetricType::Counter, captures.puts));
  families.push_back(Single("kiln_capture_rejected_total",
                            "Stored-capture records refused or dropped for failing verification.",
                            MetricType::Counter, captures.rejected));
  families.push_back(Labelled("kiln_requests_total", "RPCs received, refused ones included.", "rpc",
                              kRpcNames, Load(sources_.stats->requests)));
  families.push_back(Labelled("kiln_requests_refused_total", "Requests refused, by reason.",
                              "reason", kRefusalNames, Load(sources_.stats->refused)));
  return families;
}

}  // namespace kiln::daemon
