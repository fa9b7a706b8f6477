// CompileScheduler: single-flight over the worker pool.
#include "daemon/compile_scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kiln::daemon {

absl::StatusOr<CompileOutcome> CompileScheduler::Compile(
    const std::string& key, const kiln::v1::CompileRequest& request,
    std::chrono::system_clock::time_point deadline, const std::function<bool()>& cancelled) {
  if (absl::StatusOr<cache::CacheHit> hit = cache_->Lookup(key); hit.ok()) {
    CompileOutcome outcome;
    outcome.artifact = std::move(hit->artifact);
    outcome.cache_hit = true;
    return outcome;
  }
  if (frozen_) {
    stats_->Refuse(Refusal::kFrozen);
    return absl::FailedPreconditionError("kilnd is frozen: it serves cached artifacts only");
  }

  std::shared_ptr<Flight> flight;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = flights_.find(key);
    if (it != flights_.end()) {
      flight = it->second;
    } else {
      flight = std::make_shared<Flight>();
      // The task owns a copy of the request: the caller may give up before the compile ends.
      auto owned = std::make_shared<kiln::v1::CompileRequest>(request);
      if (!pool_->TrySubmit([this, key, owned, flight] { Run(key, *owned, flight); })) {
        stats_->Refuse(Refusal::kQueueFull);
        return absl::ResourceExhaustedError("compile queue is full; retry later");
      }
      flights_.emplace(key, flight);
    }
  }

  ++stats_->waiting;
  struct Leave {
    std::atomic<uint64_t>& waiting;
    ~Leave() { --waiting; }
  } leave{stats_->waiting};
  std::unique_lock<std::mutex> lock(flight->mu);
  while (!flight->done) {
    auto now = std::chrono::system_clock::now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline passed while compiling");
    if (cancelled && cancelled()) return absl::CancelledError("client cancelled");
    // Wake now and then to notice a cancelled client.
    flight->cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
  }
  return flight->outcome;
}

void CompileScheduler::Run(const std::string& key, const kiln::v1::CompileRequest& request,
                           const std::shared_ptr<Flight>& flight) {
  CompileOutcome outcome;
  if (absl::StatusOr<cache::CacheHit> hit = cache_->LookupLocal(key); hit.ok()) {
    // Another flight for this key finished between our caller's lookup and now (and stored
    // locally: the shared tier was asked by that lookup already).
    outcome.artifact = std::move(hit->artifact);
    outcome.cache_hit = true;
  } else {
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<kiln::v1::ArtifactBody> body = compiler_->Compile(request);
    auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - start);
    stats_->compile_latency.Record(elapsed);
    outcome.compile_seconds = elapsed.count() / 1e6;
    if (body.ok()) {
      body->set_key(key);
      body->set_compiler_version(compiler_->VersionFor(request.target().device_kind()));
      *body->mutable_target() = request.target();
      kiln::v1::Artifact artifact = cache::SignArtifact(*mac_, *body);
      if (absl::Status s = cache_->Store(key, artifact); !s.ok()) {
        spdlog::error("cannot store artifact {}: {}", key, s.ToString());
      }
      outcome.artifact = std::move(artifact);
    } else {
      ++stats_->compile_errors;
      outcome.error = compiler::CompileErrorFromStatus(body.status());
      spdlog::info("compile of {} failed: {}", key, outcome.error->message());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    flights_.erase(key);
  }
  std::lock_guard<std::mutex> lock(flight->mu);
  flight->outcome = std::move(outcome);
  flight->done = true;
  flight->cv.notify_all();
}

}  // namespace kiln::daemon
