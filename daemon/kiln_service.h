// The gRPC face of kilnd: authenticates and validates every call, then hands compiles to the
// scheduler. Errors become gRPC statuses here and nowhere else.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "cache/artifact_cache.h"
#include "cache/artifact_store.h"
#include "cache/capture_records.h"
#include "compiler/compiler.h"
#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_allowlist.h"
#include "daemon/compile_scheduler.h"
#include "daemon/daemon_stats.h"
#include "daemon/worker_pool.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln::daemon {

struct ServiceOptions {
  uint64_t max_request_bytes = uint64_t{64} << 20;
  bool frozen = false;
  // When non-empty, calls that did not arrive over the Unix socket must carry
  // "authorization: Bearer <token>".
  std::string token;
};

// The stored-capture records a service serves, and the store they live in (for its counts).
struct ServiceCaptures {
  cache::CaptureRecords* records;
  const cache::ArtifactStore* store;
};

class KilnServiceImpl final : public kiln::v1::KilnService::Service {
 public:
  // Pointers must outlive the service. `on_activity` is called at the start of every call;
  // `on_shutdown` when a client asks the daemon to stop; `draining` reports shutdown.
  KilnServiceImpl(ServiceOptions options, compiler::Compiler* compiler, CompileScheduler* scheduler,
                  cache::ArtifactCache* cache, cache::ArtifactStore* store,
                  ServiceCaptures captures, WorkerPool* pool, DaemonStats* stats, std::function<void()> on_activity,
                  std::function<void()> on_shutdown, const std::atomic<bool>* draining);

  grpc::Status Compile(grpc::ServerContext* context, const kiln::v1::CompileRequest* request,
                       kiln::v1::CompileResponse* response) override;
  grpc::Status Lookup(grpc::ServerContext* context, const kiln::v1::LookupRequest* request,
                      kiln::v1::LookupResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const kiln::v1::StatsRequest* request,
                     kiln::v1::StatsResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const kiln::v1::HealthRequest* request,
                      kiln::v1::HealthResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const kiln::v1::ShutdownRequest* request,
                        kiln::v1::ShutdownResponse* response) override;
  grpc::Status PutCaptures(grpc::ServerContext* context,
                           const kiln::v1::PutCapturesRequest* request,
                           kiln::v1::PutCapturesResponse* response) override;
  grpc::Status GetCaptures(grpc::ServerContext* context,
                           const kiln::v1::GetCapturesRequest* request,
                           kiln::v1::GetCapturesResponse* response) override;

  // Calls being handled now (the daemon waits for these to reach 0 when it drains).
  int active_calls() const { return active_calls_.load(); }

 private:
  // OK when the caller may use the service; counts the call as `rpc` and as activity.
  grpc::Status Admit(grpc::ServerContext* context, Rpc rpc);
  // Size and IR checks of a compile request.
  grpc::Status CheckRequest(const kiln::v1::CompileRequest& request);

  const ServiceOptions options_;
  compiler::Compiler* compiler_;
  CompileScheduler* scheduler_;
  cache::ArtifactCache* cache_;
  cache::ArtifactStore* store_;
  ServiceCaptures captures_;
  WorkerPool* pool_;
  DaemonStats* stats_;
  std::function<void()> on_activity_;
  std::function<void()> on_shutdown_;
  const std::atomic<bool>* draining_;
  const compiler::OpAllowlist allowlist_ = compiler::OpAllowlist::Default();
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<int> active_calls_{0};
};

// absl::Status -> grpc::Status, code for code.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace kiln::daemon
