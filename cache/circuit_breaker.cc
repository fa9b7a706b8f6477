// CircuitBreaker: open on the first failure, doubling back-off between failed probes.
#include "cache/circuit_breaker.h"

#include <algorithm>

namespace kiln::cache {

bool CircuitBreaker::Allow() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !open_;
}

void CircuitBreaker::RecordSuccess() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = false;
  backoff_ = initial_backoff_;
}

bool CircuitBreaker::RecordFailure(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  reason_ = why.ToString();
  if (open_) return false;
  open_ = true;
  next_probe_ = Clock::now() + backoff_;
  return true;
}

void CircuitBreaker::RecordProbeFailure(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  reason_ = why.ToString();
  open_ = true;
  backoff_ = std::min(max_backoff_, backoff_ * 2);
  next_probe_ = Clock::now() + backoff_;
}

bool CircuitBreaker::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

CircuitBreaker::Clock::time_point CircuitBreaker::next_probe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_probe_;
}

std::string CircuitBreaker::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

}  // namespace kiln::cache
