// CompileScheduler: single-flight over the worker pool, and the fleet's leases around a compile.
#include "daemon/compile_scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kiln::daemon {
namespace {

CompileOutcome Served(kiln::v1::Artifact artifact) {
  CompileOutcome outcome;
  outcome.artifact = std::move(artifact);
  outcome.cache_hit = true;
  return outcome;
}

}  // namespace

CompileScheduler::CompileScheduler(compiler::Compiler* compiler, cache::ArtifactCache* cache,
                                   const cache::Mac* mac, WorkerPool* pool, DaemonStats* stats,
                                   SchedulerOptions options)
    : compiler_(compiler), cache_(cache), mac_(mac), pool_(pool), stats_(stats), options_(options) {
  if (options_.leases != nullptr) {
    waiter_ = std::make_unique<LeaseWaiter>(cache_, options_.leases);
  }
}

absl::StatusOr<CompileOutcome> CompileScheduler::Compile(
    const std::string& key, const kiln::v1::CompileRequest& request,
    std::chrono::system_clock::time_point deadline, const std::function<bool()>& cancelled) {
  if (absl::StatusOr<cache::CacheHit> hit = cache_->Lookup(key); hit.ok()) {
    return Served(std::move(hit->artifact));
  }
  if (options_.frozen) {
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
      auto owned = std::make_shared<const kiln::v1::CompileRequest>(request);
      if (!pool_->TrySubmit([this, key, owned, flight] { Run(key, owned, flight); })) {
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

void CompileScheduler::StopWaiting() {
  if (waiter_ != nullptr) waiter_->Stop();
}

void CompileScheduler::Run(const std::string& key, const Request& request,
                           const std::shared_ptr<Flight>& flight) {
  if (absl::StatusOr<cache::CacheHit> hit = cache_->LookupLocal(key); hit.ok()) {
    // Another flight for this key finished between our caller's lookup and now (and stored
    // locally: the shared tier was asked by that lookup already).
    Finish(key, flight, Served(std::move(hit->artifact)));
    return;
  }
  bool leased = false;
  if (options_.leases != nullptr && !flight->waited_enough) {
    // Unavailable (Redis down, slow or refusing): no one coordinates; compile as without Redis.
    absl::StatusOr<cache::Lease> lease = options_.leases->Acquire(key);
    if (lease.ok() && *lease == cache::Lease::kTheirs) {
      WaitForFleet(key, request, flight);
      return;
    }
    leased = lease.ok();
    if (leased) {
      // The last holder may have published and released since our caller's lookup.
      if (absl::StatusOr<cache::CacheHit> hit = cache_->FetchShared(key); hit.ok()) {
        options_.leases->Release(key);
        Finish(key, flight, Served(std::move(hit->artifact)));
        return;
      }
    }
  }
  CompileOutcome outcome = CompileNow(key, *request, /*local_only=*/leased);
  if (!leased) {
    Finish(key, flight, std::move(outcome));
    return;
  }
  // Our clients are answered first; then the daemons waiting on the lease must find the
  // artifact before the lease goes. After a failed compile they compile (and fail) themselves.
  std::optional<kiln::v1::Artifact> artifact = outcome.artifact;
  Finish(key, flight, std::move(outcome));
  if (artifact.has_value()) {
    if (absl::Status s = cache_->Publish(key, *artifact); !s.ok()) {
      spdlog::debug("shared cache tier: {}", s.ToString());
    }
  }
  options_.leases->Release(key);
}

CompileOutcome CompileScheduler::CompileNow(const std::string& key,
                                            const kiln::v1::CompileRequest& request,
                                            bool local_only) {
  CompileOutcome outcome;
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<kiln::v1::ArtifactBody> body = compiler_->Compile(request);
  auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  stats_->compile_latency.Record(elapsed);
  outcome.compile_seconds = elapsed.count() / 1e6;
  if (!body.ok()) {
    ++stats_->compile_errors;
    outcome.error = compiler::CompileErrorFromStatus(body.status());
    spdlog::info("compile of {} failed: {}", key, outcome.error->message());
    return outcome;
  }
  body->set_key(key);
  body->set_compiler_version(compiler_->VersionFor(request.target().device_kind()));
  *body->mutable_target() = request.target();
  kiln::v1::Artifact artifact = cache::SignArtifact(*mac_, *body);
  absl::Status stored =
      local_only ? cache_->StoreLocal(key, artifact) : cache_->Store(key, artifact);
  if (!stored.ok()) spdlog::error("cannot store artifact {}: {}", key, stored.ToString());
  outcome.artifact = std::move(artifact);
  return outcome;
}

void CompileScheduler::WaitForFleet(const std::string& key, const Request& request,
                                    const std::shared_ptr<Flight>& flight) {
  if (!flight->wait_until.has_value()) {
    flight->wait_until = std::chrono::steady_clock::now() + options_.lease_wait;
    ++stats_->shared_compile_waits;
  }
  waiter_->Wait(key, *flight->wait_until,
                [this, key, request, flight](WaitEnd end, std::optional<cache::CacheHit> hit) {
                  switch (end) {
                    case WaitEnd::kArtifact:
                      ++stats_->shared_compile_wait_hits;
                      Finish(key, flight, Served(std::move(hit->artifact)));
                      return;
                    case WaitEnd::kStopped:
                      Finish(key, flight, absl::UnavailableError("kilnd is shutting down"));
                      return;
                    case WaitEnd::kTooLong:
                      spdlog::warn(
                          "waited {} ms for another kilnd's compile of {}; compiling it here",
                          options_.lease_wait.count(), key);
                      flight->waited_enough = true;
                      break;
                    case WaitEnd::kLeaseGone:
                    case WaitEnd::kUnavailable:
                      break;
                  }
                  Resubmit(key, request, flight);
                });
}

void CompileScheduler::Resubmit(const std::string& key, const Request& request,
                                const std::shared_ptr<Flight>& flight) {
  if (!pool_->Resubmit([this, key, request, flight] { Run(key, request, flight); })) {
    Finish(key, flight, absl::UnavailableError("kilnd is shutting down"));
  }
}

void CompileScheduler::Finish(const std::string& key, const std::shared_ptr<Flight>& flight,
                              absl::StatusOr<CompileOutcome> outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = flights_.find(key); it != flights_.end() && it->second == flight) {
      flights_.erase(it);
    }
  }
  std::lock_guard<std::mutex> lock(flight->mu);
  flight->outcome = std::move(outcome);
  flight->done = true;
  flight->cv.notify_all();
}

}  // namespace kiln::daemon
