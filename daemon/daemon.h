// One kilnd instance: its cache, worker pool, scheduler and gRPC server, started and drained as
// a unit. kilnd's main wraps it with signals and detaching; tests run it in-process.
//
// Lifecycle: Start() binds the socket (refusing when another daemon holds it) and serves;
// Wait() blocks until RequestShutdown(), a Shutdown RPC, or the idle timeout, then drains: new
// calls are refused, calls and compiles in flight finish (up to drain_seconds for calls), the
// socket is removed, the metrics listener stopped and the database closed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/artifact_cache.h"
#include "cache/capture_records.h"
#include "cache/artifact_store.h"
#include "cache/compile_lease.h"
#include "cache/mac.h"
#include "cache/remote_store.h"
#include "compiler/compiler.h"
#include "daemon/compile_scheduler.h"
#include "daemon/config.h"
#include "daemon/daemon_stats.h"
#include "daemon/kiln_service.h"
#include "daemon/metrics_endpoint.h"
#include "daemon/worker_pool.h"

namespace kiln::daemon {

class Daemon {
 public:
  // `config` must have been through FinishConfig. `compiler` must outlive the daemon.
  Daemon(DaemonConfig config, compiler::Compiler* compiler);
  ~Daemon();

  absl::Status Start();
  // Blocks until shutdown is requested, then drains. Returns once everything is closed.
  void Wait();
  // Asks Wait() to drain and return. Safe from any thread (not from a signal handler).
  void RequestShutdown();

  const DaemonConfig& config() const { return config_; }
  // The TCP port actually bound (when listen_tcp asked for port 0), or 0.
  int tcp_port() const { return tcp_port_; }
  // The metrics port actually bound (when metrics_listen asked for port 0), or 0 when none.
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }

 private:
  absl::Status PrepareSocketDir();
  // The shared tier the configuration names (needs mac_).
  absl::StatusOr<std::unique_ptr<cache::RedisStore>> OpenRedis() const;
  bool IdleExpired() const;

  DaemonConfig config_;
  compiler::Compiler* compiler_;

  int lock_fd_ = -1;
  std::unique_ptr<cache::Mac> mac_;
  std::unique_ptr<cache::ArtifactStore> store_;
  std::unique_ptr<cache::RedisStore> remote_;
  std::unique_ptr<cache::CompileLeases> leases_;  // with a writable Redis and leases on
  std::unique_ptr<cache::ArtifactCache> cache_;
  std::unique_ptr<cache::ArtifactStore> capture_store_;  // stored-capture records
  std::unique_ptr<cache::CaptureRecords> captures_;
  std::unique_ptr<WorkerPool> pool_;
  DaemonStats stats_;
  std::unique_ptr<CompileScheduler> scheduler_;
  std::unique_ptr<KilnServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
  // After what it reads from, so that it stops first.
  std::unique_ptr<MetricsEndpoint> metrics_;

  std::atomic<bool> draining_{false};
  std::atomic<int64_t> last_activity_ns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool shutdown_requested_ = false;
  bool stopped_ = false;
};

}  // namespace kiln::daemon
