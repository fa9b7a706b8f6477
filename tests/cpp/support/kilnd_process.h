// kilnd (with the test compiler) as a child process: started in the foreground on a socket in a
// test's directory, killed or stopped by the test.
#pragma once

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "kiln/v1/service.grpc.pb.h"
#include "tests/cpp/support/wait_for.h"

namespace kiln::testing {

inline std::string KilndForTestsPath() { return KILND_FOR_TESTS; }

// Runs kilnd_for_tests with `args` and waits for it to exit; returns its exit code and stdout.
inline std::pair<int, std::string> RunKilnd(const std::vector<std::string>& args) {
  std::string command = KilndForTestsPath();
  for (const auto& a : args) command += " '" + a + "'";
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class KilndProcess {
 public:
  KilndProcess(const std::string& dir, int compile_delay_ms,
               std::vector<std::string> extra_args = {})
      : socket_(dir + "/run/kilnd.sock") {
    std::vector<std::string> args = {
        KilndForTestsPath(), "--foreground", "--cache-dir", dir + "/cache",
        "--socket",          socket_,        "--workers",   "2"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::string delay = "KILN_TEST_COMPILE_DELAY_MS=" + std::to_string(compile_delay_ms);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::putenv(delay.data());
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~KilndProcess() { Kill(SIGKILL); }

  // True once the daemon answers Health (false if it exited or did not answer in time).
  bool WaitServing() {
    bool serving =
        WaitFor([this] {
          if (!Running()) return true;
          // A fresh channel per probe: a channel that failed to connect backs off for seconds.
          auto probe = kiln::v1::KilnService::NewStub(
              grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
          kiln::v1::HealthResponse health;
          return probe->Health(&context, kiln::v1::HealthRequest(), &health).ok();
        }) &&
        Running();
    if (serving) {
      stub_ = kiln::v1::KilnService::NewStub(
          grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
    }
    return serving;
  }

  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = status;
      pid_ = -1;
      return false;
    }
    return true;
  }

  void Kill(int signal) {
    if (pid_ > 0) {
      ::kill(pid_, signal);
      if (signal == SIGKILL) {
        int status = 0;
        ::waitpid(pid_, &status, 0);
        exit_status_ = status;
        pid_ = -1;
      }
    }
  }

  // Waits for the process to exit; its wait status, or nullopt on timeout.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (!WaitFor([this] { return !Running(); }, timeout)) return std::nullopt;
    return exit_status_;
  }

  kiln::v1::StatsResponse Stats() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    kiln::v1::StatsResponse stats;
    stub_->Stats(&context, kiln::v1::StatsRequest(), &stats);
    return stats;
  }

  grpc::Status Compile(const kiln::v1::CompileRequest& request,
                       kiln::v1::CompileResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub_->Compile(&context, request, response);
  }

  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
  std::unique_ptr<kiln::v1::KilnService::Stub> stub_;
};

}  // namespace kiln::testing
