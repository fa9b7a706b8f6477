// The path from a validated request to an artifact: cache lookup, then one compile per key
// however many clients ask at once (single-flight), run on the worker pool, signed, cached.
//
// Contract: for one key at most one compile runs at a time, and a compile that finished and
// stored its artifact is never repeated for a request that arrives after it (the worker checks
// the cache again before compiling). Waiters stop waiting at their deadline; the compile goes on
// and its artifact is cached.
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
#include "cache/mac.h"
#include "compiler/compiler.h"
#include "daemon/daemon_stats.h"
#include "daemon/worker_pool.h"
#include "kiln/v1/service.pb.h"

namespace kiln::daemon {

struct CompileOutcome {
  std::optional<kiln::v1::Artifact> artifact;   // Set on success.
  std::optional<kiln::v1::CompileError> error;  // Set when the compiler refused.
  bool cache_hit = false;
  double compile_seconds = 0;
};

class CompileScheduler {
 public:
  // All pointers must outlive the scheduler.
  CompileScheduler(compiler::Compiler* compiler, cache::ArtifactCache* cache, const cache::Mac* mac,
                   WorkerPool* pool, DaemonStats* stats, bool frozen)
      : compiler_(compiler),
        cache_(cache),
        mac_(mac),
        pool_(pool),
        stats_(stats),
        frozen_(frozen) {}

  // Returns the outcome for `request` (whose key is `key`). FailedPrecondition when frozen and
  // not cached; ResourceExhausted when the queue is full; DeadlineExceeded at `deadline`;
  // Cancelled when `cancelled` turns true while waiting.
  absl::StatusOr<CompileOutcome> Compile(const std::string& key,
                                         const kiln::v1::CompileRequest& request,
                                         std::chrono::system_clock::time_point deadline,
                                         const std::function<bool()>& cancelled);

 private:
  struct Flight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    CompileOutcome outcome;
  };

  void Run(const std::string& key, const kiln::v1::CompileRequest& request,
           const std::shared_ptr<Flight>& flight);

  compiler::Compiler* compiler_;
  cache::ArtifactCache* cache_;
  const cache::Mac* mac_;
  WorkerPool* pool_;
  DaemonStats* stats_;
  const bool frozen_;

  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Flight>> flights_;
};

}  // namespace kiln::daemon
