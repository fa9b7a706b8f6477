// Daemon: assembling kilnd's parts, binding its listeners, and draining it.
#include "daemon/daemon.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/metrics.h"
#include "daemon/own_directory.h"
#include "daemon/request_decoding.h"

namespace kiln::daemon {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Reads a file named by the configuration. A secret that others can read is used, but loudly.
absl::StatusOr<std::string> ReadFileNamed(const std::string& path, std::string_view what,
                                          bool secret) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", std::string(what), " ", path));
  }
  if (secret && (st.st_mode & 077) != 0) {
    spdlog::warn("{} {} is readable by group or others; chmod 600 it", what, path);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", std::string(what), " ", path));
  return buffer.str();
}

// Whose leases this daemon's are, in Redis: unique across the fleet, and saying where it runs.
std::string LeaseHolder() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device random;
  return absl::StrCat(host, ":", ::getpid(), ":", absl::Hex(random(), absl::kZeroPad8),
                      absl::Hex(random(), absl::kZeroPad8));
}

}  // namespace

Daemon::Daemon(DaemonConfig config, compiler::Compiler* compiler)
    : config_(std::move(config)), compiler_(compiler) {}

Daemon::~Daemon() {
  if (server_ != nullptr && !stopped_) {
    RequestShutdown();
    Wait();
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

absl::Status Daemon::PrepareSocketDir() {
  std::string dir = std::filesystem::path(config_.socket_path).parent_path().string();
  if (absl::Status s = EnsureOwnDirectory(dir, "the socket's directory", true); !s.ok()) return s;
  if (absl::Status s = CheckSocketPath(config_.socket_path); !s.ok()) return s;
  // The lock, not the socket file, says whether a daemon serves this path: a killed daemon
  // leaves its socket behind but its lock goes with it.
  std::string lock_path = config_.socket_path + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("another kilnd is serving ", config_.socket_path));
  }
  // Checked again under the lock: only a socket (a dead daemon's) is ever removed.
  if (absl::Status s = CheckSocketPath(config_.socket_path); !s.ok()) return s;
  ::unlink(config_.socket_path.c_str());
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  if (!config_.listen_tcp.empty() &&
      (config_.tls_cert.empty() || config_.tls_key.empty() || config_.token_file.empty())) {
    return absl::InvalidArgumentError(
        "refusing a TCP listener without a TLS certificate, key and token file");
  }
  if (absl::Status s = EnsureOwnDirectory(config_.cache_dir, "--cache-dir", false); !s.ok()) {
    return s;
  }
  if (absl::Status s = PrepareSocketDir(); !s.ok()) return s;

  absl::StatusOr<cache::Mac> mac = cache::Mac::LoadOrCreate(config_.mac_key_file);
  if (!mac.ok()) return mac.status();
  mac_ = std::make_unique<cache::Mac>(*std::move(mac));

  cache::ArtifactStoreOptions store_options;
  store_options.path = config_.cache_dir + "/artifacts";
  store_options.max_bytes = config_.cache_max_bytes;
  absl::StatusOr<std::unique_ptr<cache::ArtifactStore>> store =
      cache::ArtifactStore::Open(store_options);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);

  if (!config_.redis.empty()) {
    absl::StatusOr<std::unique_ptr<cache::RedisStore>> remote = OpenRedis();
    if (!remote.ok()) return remote.status();
    remote_ = *std::move(remote);
    // A read-only daemon publishes nothing, so it cannot hold a lease that others wait on; a
    // frozen one never compiles.
    if (!config_.redis_read_only && !config_.frozen && config_.redis_lease_wait_ms > 0) {
      leases_ = std::make_unique<cache::CompileLeases>(
          remote_.get(), cache::CompileLeaseOptions{
                             LeaseHolder(), std::chrono::milliseconds(config_.redis_lease_ttl_ms)});
    }
  }
  cache_ = std::make_unique<cache::ArtifactCache>(store_.get(), remote_.get(), mac_.get());
  // Stored captures in a store of their own: a few KB each, counted and evicted apart from the
  // artifacts.
  cache::ArtifactStoreOptions capture_options;
  capture_options.path = config_.cache_dir + "/capture-records";
  capture_options.max_bytes = std::max<uint64_t>(uint64_t{64} << 20, config_.cache_max_bytes / 16);
  absl::StatusOr<std::unique_ptr<cache::ArtifactStore>> capture_store =
      cache::ArtifactStore::Open(capture_options);
  if (!capture_store.ok()) return capture_store.status();
  capture_store_ = *std::move(capture_store);
  captures_ =
      std::make_unique<cache::CaptureRecords>(capture_store_.get(), remote_.get(), mac_.get());
  pool_ = std::make_unique<WorkerPool>(config_.workers, config_.queue_limit);
  scheduler_ = std::make_unique<CompileScheduler>(
      compiler_, cache_.get(), mac_.get(), pool_.get(), &stats_,
      SchedulerOptions{config_.frozen, leases_.get(),
                       std::chrono::milliseconds(config_.redis_lease_wait_ms)});

  ServiceOptions service_options;
  service_options.max_request_bytes = config_.max_request_bytes;
  service_options.frozen = config_.frozen;
  if (!config_.listen_tcp.empty()) {
    absl::StatusOr<std::string> token = ReadFileNamed(config_.token_file, "token file", true);
    if (!token.ok()) return token.status();
    service_options.token = std::string(absl::StripAsciiWhitespace(*token));
    if (service_options.token.size() < 16) {
      return absl::InvalidArgumentError("the bearer token must be at least 16 characters");
    }
  }
  last_activity_ns_ = NowNs();
  service_ = std::make_unique<KilnServiceImpl>(
      service_options, compiler_, scheduler_.get(), cache_.get(), store_.get(),
      ServiceCaptures{captures_.get(), capture_store_.get()}, pool_.get(), &stats_, [this] { last_activity_ns_ = NowNs(); }, [this] { RequestShutdown(); }, &draining_);
  if (!config_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = MetricsEndpoint::Start(
        config_.metrics_listen, std::make_shared<DaemonMetrics>(MetricsSources{
                                    &stats_, pool_.get(), cache_.get(), store_.get(),
                                    captures_.get(), capture_store_.get()}));
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    spdlog::info("serving metrics on {} (port {})", config_.metrics_listen, metrics_->port());
  }

  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + config_.socket_path, grpc::InsecureServerCredentials());
  if (!config_.listen_tcp.empty()) {
    absl::StatusOr<std::string> cert = ReadFileNamed(config_.tls_cert, "TLS certificate", false);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFileNamed(config_.tls_key, "TLS key", true);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    builder.AddListeningPort(config_.listen_tcp, grpc::SslServerCredentials(ssl), &tcp_port_);
  }
  // gRPC's own limit sits above ours so that an oversized request reaches CheckRequest and is
  // answered INVALID_ARGUMENT; only far larger ones are cut off by gRPC (RESOURCE_EXHAUSTED).
  uint64_t grpc_limit = std::min<uint64_t>(config_.max_request_bytes * 2 + (1 << 20), INT_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(grpc_limit));
  builder.SetMaxSendMessageSize(INT_MAX);
  builder.RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RequestDecodingInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  mode_t old_umask = ::umask(0177);  // the socket is born 0600
  server_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.socket_path,
                                               config_.listen_tcp.empty() ? "" : " or ",
                                               config_.listen_tcp));
  }
  if (!config_.listen_tcp.empty() && tcp_port_ == 0) {
    server_->Shutdown();
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen_tcp));
  }
  ::chmod(config_.socket_path.c_str(), 0600);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<cache::RedisStore>> Daemon::OpenRedis() const {
  cache::RedisStoreOptions redis;
  if (absl::Status s = cache::ParseRedisAddress(config_.redis, &redis.endpoint); !s.ok()) return s;
  redis.endpoint.user = config_.redis_user;
  if (!config_.redis_password_file.empty()) {
    absl::StatusOr<std::string> password =
        ReadFileNamed(config_.redis_password_file, "Redis password file", true);
    if (!password.ok()) return password.status();
    redis.endpoint.password = std::string(absl::StripAsciiWhitespace(*password));
  }
  redis.endpoint.tls = config_.redis_tls;
  redis.endpoint.tls_ca_file = config_.redis_tls_ca;
  redis.endpoint.tls_cert_file = config_.redis_tls_cert;
  redis.endpoint.tls_key_file = config_.redis_tls_key;
  redis.endpoint.tls_server_name = config_.redis_tls_server_name;
  redis.read_only = config_.redis_read_only;
  redis.timeout = std::chrono::milliseconds(config_.redis_timeout_ms);
  // Daemons signing with another key neither read nor overwrite ours. Another compiler's
  // entries are apart already: every key hashes the version of the compiler of its target, so
  // daemons that differ only in a device kind a request does not use (one without NVRTC) share
  // that request's entries.
  redis.key_namespace = absl::StrCat("kiln:v1:", mac_->Fingerprint());
  return cache::RedisStore::Create(std::move(redis));
}

void Daemon::RequestShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_requested_ = true;
  cv_.notify_all();
}

bool Daemon::IdleExpired() const {
  if (config_.idle_exit_seconds <= 0) return false;
  if (pool_->queue_depth() > 0 || pool_->running() > 0 || service_->active_calls() > 0) {
    return false;
  }
  int64_t idle_ns = NowNs() - last_activity_ns_.load();
  return idle_ns >= int64_t{config_.idle_exit_seconds} * 1'000'000'000;
}

void Daemon::Wait() {
  if (server_ == nullptr || stopped_) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (!shutdown_requested_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (IdleExpired()) {
        spdlog::info("idle for {} s; exiting", config_.idle_exit_seconds);
        break;
      }
    }
  }
  draining_ = true;  // new compiles are refused from here on
  // Let the calls in flight finish (they wait for their compiles), up to drain_seconds; then stop
  // the server at once. Server::Shutdown with a distant deadline was seen to linger for seconds
  // on idle client connections, so the daemon does its own waiting.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(config_.drain_seconds * 1000));
  while (service_->active_calls() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->Shutdown(std::chrono::system_clock::now());  // cancels any call still running
  scheduler_->StopWaiting();  // no client is left to serve another daemon's artifact to
  pool_->Drain();             // queued compiles still finish and are cached
  server_->Wait();
  metrics_.reset();  // scraped until now, so a drain shows in the metrics
  ::unlink(config_.socket_path.c_str());
  stopped_ = true;
}

}  // namespace kiln::daemon
