// The path from a validated request to an artifact: cache lookup, then one compile per key
// however many clients ask at once (single-flight), run on the worker pool, signed, cached; and,
// with a fleet's compile leases, one compile per key across the daemons that share a Redis.
//
// Contract: for one key at most one compile runs at a time, and a compile that finished and
// stored its artifact is never repeated for a request that arrives after it (the worker checks
// the cache again before compiling). Waiters stop waiting at their deadline; the compile goes on
// and its artifact is cached.
//
// With leases (cache/compile_lease.h), a worker takes the key's lease before compiling and looks
// in the shared tier once more; the holder answers its clients, publishes the artifact and only
// then releases the lease (after a failed compile too, so that others compile and fail at once).
// A key whose lease another daemon holds leaves the worker and waits in a LeaseWaiter for that
// daemon's artifact (served as a hit), until the lease goes without one (the worker then tries
// again), the tier stops answering, or `lease_wait` has passed since the key began waiting
// (compiled here then, without the lease). Clients of this daemon asking meanwhile share the
// flight.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "cache/artifact_cache.h"
#include "cache/compile_lease.h"
#include "cache/mac.h"
#include "compiler/compiler.h"
#include "daemon/daemon_stats.h"
#include "daemon/lease_waiter.h"
#include "daemon/worker_pool.h"
#include "kiln/v1/service.pb.h"

namespace kiln::daemon {

struct CompileOutcome {
  std::optional<kiln::v1::Artifact> artifact;   // Set on success.
  std::optional<kiln::v1::CompileError> error;  // Set when the compiler refused.
  bool cache_hit = false;
  double compile_seconds = 0;
};

struct SchedulerOptions {
  bool frozen = false;  // Never compile: FailedPrecondition on a miss.
  // The fleet's compile leases; null: this daemon coordinates with no other.
  cache::CompileLeases* leases = nullptr;
  // Longest wait for another daemon's compile of a key, from the first time the key waits.
  std::chrono::milliseconds lease_wait{0};
};

class CompileScheduler {
 public:
  // All pointers (options.leases included) must outlive the scheduler.
  CompileScheduler(compiler::Compiler* compiler, cache::ArtifactCache* cache, const cache::Mac* mac,
                   WorkerPool* pool, DaemonStats* stats, SchedulerOptions options);

  // Returns the outcome for `request` (whose key is `key`). FailedPrecondition when frozen and
  // not cached; ResourceExhausted when the queue is full; DeadlineExceeded at `deadline`;
  // Cancelled when `cancelled` turns true while waiting; Unavailable when the daemon stopped
  // while the key waited for another daemon's compile.
  absl::StatusOr<CompileOutcome> Compile(const std::string& key,
                                         const kiln::v1::CompileRequest& request,
                                         std::chrono::system_clock::time_point deadline,
                                         const std::function<bool()>& cancelled);

  // Ends the waits for other daemons' compiles (their clients get Unavailable) and refuses new
  // ones: call before draining the worker pool. Idempotent.
  void StopWaiting();

 private:
  using Request = std::shared_ptr<const kiln::v1::CompileRequest>;

  struct Flight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::StatusOr<CompileOutcome> outcome;
    // Touched only by whoever runs the flight now (a worker or the lease waiter), one at a time.
    std::optional<std::chrono::steady_clock::time_point> wait_until;  // set when it first waits
    bool waited_enough = false;  // compile here now, whoever holds the lease
  };

  void Run(const std::string& key, const Request& request, const std::shared_ptr<Flight>& flight);
  // Compiles, signs and stores (in the local tier alone when the caller publishes it).
  CompileOutcome CompileNow(const std::string& key, const kiln::v1::CompileRequest& request,
                            bool local_only);
  // Parks the flight in the lease waiter; how its wait ends decides what comes next.
  void WaitForFleet(const std::string& key, const Request& request,
                    const std::shared_ptr<Flight>& flight);
  void Resubmit(const std::string& key, const Request& request,
                const std::shared_ptr<Flight>& flight);
  // Ends the flight: later requests start a new one; its waiters get `outcome`.
  void Finish(const std::string& key, const std::shared_ptr<Flight>& flight,
              absl::StatusOr<CompileOutcome> outcome);

  compiler::Compiler* compiler_;
  cache::ArtifactCache* cache_;
  const cache::Mac* mac_;
  WorkerPool* pool_;
  DaemonStats* stats_;
  const SchedulerOptions options_;

  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Flight>> flights_;
  // Last: stopped first, while what its waits call back into still exists.
  std::unique_ptr<LeaseWaiter> waiter_;
};

}  // namespace kiln::daemon
