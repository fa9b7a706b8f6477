// An in-process kilnd over a TestCompiler, on a Unix socket in its own temporary directory,
// with a stub to talk to it. Restart() stops it and starts a fresh one on the same directories,
// as a daemon restart would.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "compiler/testing/test_compiler.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "kiln/v1/service.grpc.pb.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::testing {

class TestDaemon {
 public:
  // `dir` holds the cache and the socket; it must outlive the daemon.
  TestDaemon(const std::string& dir, compiler::TestCompilerOptions compiler_options = {},
             const std::function<void(daemon::DaemonConfig&)>& configure = nullptr)
      : compiler_options_(std::move(compiler_options)) {
    config_.cache_dir = dir + "/cache";
    config_.socket_path = dir + "/run/kilnd.sock";
    config_.workers = 4;
    if (configure) configure(config_);
    EXPECT_TRUE(daemon::FinishConfig(config_).ok());
    Start();
  }
  ~TestDaemon() { Stop(); }

  void Start() {
    compiler_ = std::make_unique<compiler::TestCompiler>(compiler_options_);
    daemon_ = std::make_unique<daemon::Daemon>(config_, compiler_.get());
    start_status_ = daemon_->Start();
    ASSERT_TRUE(start_status_.ok()) << start_status_;
  }
  void Stop() {
    if (daemon_) {
      daemon_->RequestShutdown();
      daemon_->Wait();
      daemon_.reset();
    }
  }
  void Restart(const std::function<void(daemon::DaemonConfig&)>& reconfigure = nullptr) {
    Stop();
    if (reconfigure) reconfigure(config_);
    Start();
  }

  // A new channel of its own (a separate connection), as a separate client process would have.
  std::unique_ptr<kiln::v1::KilnService::Stub> NewClient() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return kiln::v1::KilnService::NewStub(grpc::CreateCustomChannel(
        "unix:" + config_.socket_path, grpc::InsecureChannelCredentials(), args));
  }

  grpc::Status Compile(const kiln::v1::CompileRequest& request, kiln::v1::CompileResponse* response,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    return NewClient()->Compile(&context, request, response);
  }

  grpc::Status PutCaptures(const std::string& key, const std::string& record) const {
    grpc::ClientContext context;
    kiln::v1::PutCapturesRequest request;
    request.set_key(key);
    request.set_record(record);
    kiln::v1::PutCapturesResponse response;
    return NewClient()->PutCaptures(&context, request, &response);
  }

  grpc::Status GetCaptures(const std::string& key, kiln::v1::GetCapturesResponse* response) const {
    grpc::ClientContext context;
    kiln::v1::GetCapturesRequest request;
    request.set_key(key);
    return NewClient()->GetCaptures(&context, request, response);
  }

  kiln::v1::StatsResponse Stats() const {
    grpc::ClientContext context;
    kiln::v1::StatsResponse response;
    EXPECT_TRUE(NewClient()->Stats(&context, kiln::v1::StatsRequest(), &response).ok());
    return response;
  }

  compiler::TestCompiler& compiler() { return *compiler_; }
  const daemon::DaemonConfig& config() const { return config_; }
  daemon::Daemon& daemon() { return *daemon_; }

 private:
  compiler::TestCompilerOptions compiler_options_;
  daemon::DaemonConfig config_;
  std::unique_ptr<compiler::TestCompiler> compiler_;
  std::unique_ptr<daemon::Daemon> daemon_;
  absl::Status start_status_;
};

}  // namespace kiln::testing
