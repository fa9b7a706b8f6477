// KilnServiceImpl: admission (token), validation, and the RPCs.
#include "daemon/kiln_service.h"

#include <openssl/crypto.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "cache/cache_key.h"

namespace kiln::daemon {
namespace {

// Counts a call as active for the lifetime of its handler.
class ActiveCall {
 public:
  explicit ActiveCall(std::atomic<int>& count) : count_(count) { ++count_; }
  ~ActiveCall() { --count_; }

 private:
  std::atomic<int>& count_;
};

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Never INTERNAL without details: that is how gRPC answers bytes that do not decode, which
  // RequestDecodingInterceptorFactory turns into INVALID_ARGUMENT.
  std::string message(status.message());
  if (message.empty()) message = absl::StatusCodeToString(status.code());
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

KilnServiceImpl::KilnServiceImpl(ServiceOptions options, compiler::Compiler* compiler,
                                 CompileScheduler* scheduler, cache::ArtifactCache* cache,
                                 cache::ArtifactStore* store, ServiceCaptures captures,
                                 WorkerPool* pool, DaemonStats* stats,
                                 std::function<void()> on_activity,
                                 std::function<void()> on_shutdown,
                                 const std::atomic<bool>* draining)
    : options_(std::move(options)),
      compiler_(compiler),
      scheduler_(scheduler),
      cache_(cache),
      store_(store),
      captures_(captures),
      pool_(pool),
      stats_(stats),
      on_activity_(std::move(on_activity)),
      on_shutdown_(std::move(on_shutdown)),
      draining_(draining) {}

grpc::Status KilnServiceImpl::Admit(grpc::ServerContext* context, Rpc rpc) {
  stats_->Count(rpc);
  if (on_activity_) on_activity_();
  // The Unix socket is guarded by its 0600 mode; every other transport needs the token.
  if (options_.token.empty() || context->peer().rfind("unix:", 0) == 0) return grpc::Status::OK;
  const std::string expected = "Bearer " + options_.token;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end() || it->second.size() != expected.size() ||
      CRYPTO_memcmp(it->second.data(), expected.data(), expected.size()) != 0) {
    stats_->Refuse(Refusal::kUnauthenticated);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");
  }
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::CheckRequest(const kiln::v1::CompileRequest& request) {
  size_t bytes = request.ByteSizeLong();
  if (bytes > options_.max_request_bytes) {
    stats_->Refuse(Refusal::kTooLarge);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request of ", bytes, " bytes exceeds the limit of ",
                                     options_.max_request_bytes));
  }
  if (absl::Status s = compiler::ValidateRequest(request, allowlist_); !s.ok()) {
    stats_->Refuse(Refusal::kInvalid);
    return ToGrpc(s);
  }
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::Compile(grpc::ServerContext* context,
                                      const kiln::v1::CompileRequest* request,
                                      kiln::v1::CompileResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kCompile); !s.ok()) return s;
  if (grpc::Status s = CheckRequest(*request); !s.ok()) return s;
  if (draining_->load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kilnd is shutting down");
  }
  const std::string key =
      cache::CacheKey(*request, compiler_->VersionFor(request->target().device_kind()));
  absl::StatusOr<CompileOutcome> outcome = scheduler_->Compile(
      key, *request, context->deadline(), [context] { return context->IsCancelled(); });
  if (!outcome.ok()) return ToGrpc(outcome.status());
  response->set_key(key);
  response->set_cache_hit(outcome->cache_hit);
  response->set_compile_seconds(outcome->compile_seconds);
  if (outcome->artifact.has_value()) {
    *response->mutable_artifact() = std::move(*outcome->artifact);
  } else if (outcome->error.has_value()) {
    *response->mutable_error() = std::move(*outcome->error);
  }
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::Lookup(grpc::ServerContext* context,
                                     const kiln::v1::LookupRequest* request,
                                     kiln::v1::LookupResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kLookup); !s.ok()) return s;
  std::string key;
  switch (request->by_case()) {
    case kiln::v1::LookupRequest::kKey:
      if (!cache::IsWellFormedKey(request->key())) {
        stats_->Refuse(Refusal::kInvalid);
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed key");
      }
      key = request->key();
      break;
    case kiln::v1::LookupRequest::kRequest:
      if (grpc::Status s = CheckRequest(request->request()); !s.ok()) return s;
      key = cache::CacheKey(request->request(),
                            compiler_->VersionFor(request->request().target().device_kind()));
      break;
    default:
      stats_->Refuse(Refusal::kInvalid);
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lookup needs a key or a request");
  }
  response->set_key(key);
  absl::StatusOr<cache::CacheHit> hit = cache_->Lookup(key);
  if (hit.ok()) {
    response->set_found(true);
    *response->mutable_artifact() = std::move(hit->artifact);
  }
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::Stats(grpc::ServerContext* context, const kiln::v1::StatsRequest*,
                                    kiln::v1::StatsResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kStats); !s.ok()) return s;
  cache::ArtifactStoreStats store = store_->Stats();
  const cache::ArtifactCacheStats lookups = cache_->Stats();
  const LatencyHistogram::Snapshot compiles = stats_->compile_latency.Read();
  response->set_hits(lookups.hits());
  response->set_misses(lookups.misses);
  response->set_compiles(compiles.count);
  response->set_compile_errors(stats_->compile_errors);
  response->set_compile_seconds(compiles.sum_micros / 1e6);
  response->set_bytes_stored(store.bytes);
  response->set_entries(store.entries);
  response->set_queue_depth(pool_->queue_depth());
  response->set_in_flight(pool_->running());
  response->set_remote_hits(lookups.remote_hits);
  response->set_evictions(store.evictions);
  response->set_corrupt_records(store.corrupt + lookups.rejected);
  response->set_rejected(stats_->refused_total());
  response->set_waiting(stats_->waiting);
  response->set_damaged_files(store.damaged_files);
  response->set_wal_damaged(store.wal_damaged);
  response->set_store_repairs(store.repairs);
  response->set_compactions(store.compactions);
  const cache::RemoteStoreStats remote = cache_->remote_stats();
  response->set_remote_errors(remote.errors);
  response->set_remote_skipped(remote.skipped);
  response->set_remote_writes(remote.writes);
  response->set_remote_writes_dropped(remote.writes_dropped);
  response->set_remote_down(remote.down);
  response->set_shared_compile_waits(stats_->shared_compile_waits);
  response->set_shared_compile_wait_hits(stats_->shared_compile_wait_hits);
  const cache::CaptureRecordStats captures = captures_.records->Stats();
  response->set_capture_records(captures_.store->Stats().entries);
  response->set_capture_hits(captures.gets);
  response->set_capture_puts(captures.puts);
  response->set_capture_rejected(captures.rejected);
  response->set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::Health(grpc::ServerContext* context, const kiln::v1::HealthRequest*,
                                     kiln::v1::HealthResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kHealth); !s.ok()) return s;
  response->set_state(draining_->load() ? kiln::v1::HealthResponse::STATE_DRAINING
                                        : kiln::v1::HealthResponse::STATE_SERVING);
  response->set_compiler_version(compiler_->Version());
  for (kiln::v1::DeviceKind kind : {kiln::v1::DEVICE_KIND_CPU, kiln::v1::DEVICE_KIND_CUDA}) {
    kiln::v1::CompilerVersion* version = response->add_compiler_versions();
    version->set_device_kind(kind);
    version->set_version(compiler_->VersionFor(kind));
  }
  response->set_pid(::getpid());
  response->set_frozen(options_.frozen);
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::Shutdown(grpc::ServerContext* context,
                                       const kiln::v1::ShutdownRequest*,
                                       kiln::v1::ShutdownResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kShutdown); !s.ok()) return s;
  if (on_shutdown_) on_shutdown_();
  response->set_accepted(true);
  return grpc::Status::OK;
}

grpc::Status KilnServiceImpl::PutCaptures(grpc::ServerContext* context,
                                          const kiln::v1::PutCapturesRequest* request,
                                          kiln::v1::PutCapturesResponse*) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kPutCaptures); !s.ok()) return s;
  if (options_.frozen) {
    stats_->Refuse(Refusal::kFrozen);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "kilnd is frozen: it stores nothing new");
  }
  absl::Status stored = captures_.records->Put(request->key(), request->record());
  if (absl::IsInvalidArgument(stored) || absl::IsPermissionDenied(stored)) {
    stats_->Refuse(Refusal::kInvalid);
  }
  return ToGrpc(stored);
}

grpc::Status KilnServiceImpl::GetCaptures(grpc::ServerContext* context,
                                          const kiln::v1::GetCapturesRequest* request,
                                          kiln::v1::GetCapturesResponse* response) {
  ActiveCall active(active_calls_);
  if (grpc::Status s = Admit(context, Rpc::kGetCaptures); !s.ok()) return s;
  if (!cache::IsWellFormedKey(request->key())) {
    stats_->Refuse(Refusal::kInvalid);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed capture key");
  }
  absl::StatusOr<std::string> record = captures_.records->Get(request->key());
  if (record.ok()) {
    response->set_found(true);
    response->set_record(*std::move(record));
  }
  return grpc::Status::OK;
}

}  // namespace kiln::daemon
