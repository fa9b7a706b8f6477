// A circuit breaker for a dependency that can hang as well as fail. One failure opens it, a
// timeout as much as a refused connection (a stopped server still accepts connections, then
// answers nothing), and while it is open callers skip the dependency at once instead of each
// waiting out a timeout. Its owner probes off the request path once NextProbe() has come and
// reports the outcome: a success closes the breaker, a failure keeps it open twice as long (up
// to max_backoff). Thread-safe.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace kiln::cache {

class CircuitBreaker {
 public:
  using Clock = std::chrono::steady_clock;

  CircuitBreaker(std::chrono::milliseconds backoff, std::chrono::milliseconds max_backoff)
      : initial_backoff_(backoff), max_backoff_(max_backoff), backoff_(backoff) {}

  // False while open: do not call the dependency.
  bool Allow() const;
  // A call succeeded (or a probe did): closes the breaker, back-off back to its initial value.
  void RecordSuccess();
  // A call failed: opens the breaker if it was closed; true when this call opened it. Calls
  // that were in flight when it opened do not lengthen the back-off.
  bool RecordFailure(const absl::Status& why);
  // A probe failed: the breaker stays open, the next probe comes after twice the back-off.
  void RecordProbeFailure(const absl::Status& why);

  bool open() const;
  // When the next probe is due (meaningful while open).
  Clock::time_point next_probe() const;
  // Why it opened (the last failure), for messages.
  std::string reason() const;

 private:
  const std::chrono::milliseconds initial_backoff_;
  const std::chrono::milliseconds max_backoff_;
  mutable std::mutex mu_;
  bool open_ = false;
  std::chrono::milliseconds backoff_;
  Clock::time_point next_probe_{};
  std::string reason_;
};

}  // namespace kiln::cache
