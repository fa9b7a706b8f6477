// The opt-in HTTP listener (--metrics-listen) that serves kilnd's metrics at /metrics, in the
// Prometheus text format written by prometheus-cpp. Plain HTTP without authentication.
#pragma once

#include <netinet/in.h>
#include <prometheus/collectable.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace kiln::daemon {

class MetricsEndpoint {
 public:
  // Serves `metrics` at http://`address`/metrics. `address` is "IPV4:PORT" as FinishConfig
  // leaves --metrics-listen (port 0: a free one, see port()). Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> metrics);
  // Stops listening; returns once no scrape is running, so the sources may then go.
  ~MetricsEndpoint();

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The port actually bound.
  int port() const { return port_; }

 private:
  MetricsEndpoint(std::shared_ptr<prometheus::Collectable> metrics,
                  std::unique_ptr<prometheus::Exposer> exposer, in_addr ip, int port);

  // The exposer holds a weak pointer only; it goes first, so no scrape outlives the metrics.
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  in_addr ip_;  // Where the listener is reached (loopback when it listens on every interface).
  int port_;
};

}  // namespace kiln::daemon
