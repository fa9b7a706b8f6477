// QueryStats / StopDaemon over a Unix-socket channel.
#include "daemon/control_client.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln::daemon {
namespace {

constexpr auto kProbe = std::chrono::seconds(2);

// True while `pid` runs: it exists and is not a zombie (a daemon that exited but whose parent,
// a test or a supervisor, has not reaped it yet has closed everything it held).
bool ProcessRunning(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

std::unique_ptr<kiln::v1::KilnService::Stub> Connect(const std::string& socket_path) {
  return kiln::v1::KilnService::NewStub(
      grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()));
}

absl::Status Unavailable(const std::string& socket_path, const grpc::Status& status) {
  return absl::UnavailableError(
      absl::StrCat("no kilnd answers on ", socket_path, ": ", status.error_message()));
}

}  // namespace

absl::StatusOr<kiln::v1::StatsResponse> QueryStats(const std::string& socket_path,
                                                   std::chrono::milliseconds timeout) {
  auto stub = Connect(socket_path);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  kiln::v1::StatsResponse response;
  grpc::Status status = stub->Stats(&context, kiln::v1::StatsRequest(), &response);
  if (!status.ok()) return Unavailable(socket_path, status);
  return response;
}

absl::Status StopDaemon(const std::string& socket_path, std::chrono::milliseconds timeout) {
  auto stub = Connect(socket_path);
  auto deadline = std::chrono::system_clock::now() + timeout;
  int64_t pid = 0;
  {
    grpc::ClientContext context;
    context.set_deadline(std::min(deadline, std::chrono::system_clock::now() + kProbe));
    kiln::v1::HealthResponse health;
    if (stub->Health(&context, kiln::v1::HealthRequest(), &health).ok()) pid = health.pid();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    kiln::v1::ShutdownResponse response;
    grpc::Status status = stub->Shutdown(&context, kiln::v1::ShutdownRequest(), &response);
    if (!status.ok()) return Unavailable(socket_path, status);
  }
  // Gone once it no longer answers and (on this machine: a Unix socket) its process has exited,
  // its database closed: what comes next may use the cache directory.
  while (std::chrono::system_clock::now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    kiln::v1::HealthResponse response;
    const bool answers = stub->Health(&context, kiln::v1::HealthRequest(), &response).ok();
    const bool running = pid > 0 && ProcessRunning(static_cast<pid_t>(pid));
    if (!answers && !running) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("kilnd is still draining");
}

std::string FormatStats(const kiln::v1::StatsResponse& s) {
  return absl::StrFormat(
      "hits: %d\nmisses: %d\ncompiles: %d\ncompile_errors: %d\ncompile_seconds: %.3f\n"
      "bytes_stored: %d\nentries: %d\nqueue_depth: %d\nin_flight: %d\nremote_hits: %d\n"
      "evictions: %d\ncorrupt_records: %d\nrejected: %d\nwaiting: %d\nuptime_seconds: %.1f\n"
      "damaged_files: %d\nwal_damaged: %d\nstore_repairs: %d\ncompactions: %d\n"
      "remote_errors: %d\nremote_skipped: %d\nremote_writes: %d\nremote_writes_dropped: %d\n"
      "remote_down: %d\nshared_compile_waits: %d\nshared_compile_wait_hits: %d\n",
      s.hits(), s.misses(), s.compiles(), s.compile_errors(), s.compile_seconds(), s.bytes_stored(),
      s.entries(), s.queue_depth(), s.in_flight(), s.remote_hits(), s.evictions(),
      s.corrupt_records(), s.rejected(), s.waiting(), s.uptime_seconds(), s.damaged_files(),
      s.wal_damaged(), s.store_repairs(), s.compactions(), s.remote_errors(), s.remote_skipped(),
      s.remote_writes(), s.remote_writes_dropped(), s.remote_down() ? 1 : 0,
      s.shared_compile_waits(), s.shared_compile_wait_hits());
}

}  // namespace kiln::daemon
