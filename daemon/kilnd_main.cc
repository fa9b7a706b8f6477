// KilndMain: parsing, detaching with a readiness pipe, signals, and the daemon's lifetime.
#include "daemon/kilnd_main.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "daemon/config.h"
#include "daemon/control_client.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"
#include "daemon/own_directory.h"

namespace kiln::daemon {
namespace {

// Detaches from the terminal. The parent returns only after the child reports that it serves
// (exit 0) or why it could not (exit 1), so `kilnd && client` is race-free. Returns the write
// end of the readiness pipe in the child; never returns in the parent. The child's stdin and
// stdout are /dev/null and its stderr the log file (its folder exists by now).
int Detach(const DaemonConfig& config) {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("kilnd: pipe");
    std::exit(1);
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("kilnd: fork");
    std::exit(1);
  }
  if (pid > 0) {
    ::close(fds[1]);
    std::string message;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) message.append(buf, n);
    if (message == "R") std::exit(0);
    std::cerr << "kilnd: " << (message.empty() ? "daemon exited during start" : message) << "\n";
    std::exit(1);
  }
  ::close(fds[0]);
  ::setsid();
  if (::chdir("/") != 0) std::perror("kilnd: chdir /");  // do not pin the caller's directory
  int null_fd = ::open("/dev/null", O_RDWR);
  ::dup2(null_fd, 0);
  ::dup2(null_fd, 1);
  if (!RedirectStderrTo(config.log_file).ok()) ::dup2(null_fd, 2);
  ::close(null_fd);
  return fds[1];
}

void Report(int fd, const std::string& message) {
  if (fd < 0) return;
  [[maybe_unused]] ssize_t n = ::write(fd, message.data(), message.size());
  ::close(fd);
}

}  // namespace

int KilndMain(int argc, char** argv,
              const std::function<std::unique_ptr<compiler::Compiler>()>& make_compiler) {
  absl::StatusOr<CommandLine> command = ParseCommandLine({argv + 1, argv + argc});
  if (!command.ok()) {
    std::cerr << "kilnd: " << command.status().message() << "\n(kilnd --help for usage)\n";
    return 2;
  }
  DaemonConfig& config = command->config;
  switch (command->command) {
    case Command::kHelp:
      std::cout << UsageText();
      return 0;
    case Command::kPrintPaths:
      std::cout << PathsText(config);
      return 0;
    case Command::kStats: {
      auto stats = QueryStats(config.socket_path, std::chrono::seconds(5));
      if (!stats.ok()) {
        std::cerr << "kilnd: " << stats.status().message() << "\n";
        return 1;
      }
      std::cout << FormatStats(*stats);
      return 0;
    }
    case Command::kStop: {
      auto wait =
          std::chrono::milliseconds(static_cast<int64_t>(config.drain_seconds * 1000) + 5000);
      absl::Status s = StopDaemon(config.socket_path, wait);
      if (!s.ok()) {
        std::cerr << "kilnd: " << s.message() << "\n";
        return 1;
      }
      return 0;
    }
    case Command::kServe:
      break;
  }

  // Everything kilnd creates (database, key, log, socket) is private to its user.
  ::umask(077);
  // The log lives in the cache directory: it must exist before the log is opened.
  for (const std::string& dir :
       {config.cache_dir, std::filesystem::path(config.log_file).parent_path().string()}) {
    if (absl::Status s = EnsureOwnDirectory(dir, "--cache-dir", false); !s.ok()) {
      std::cerr << "kilnd: " << s.message() << "\n";
      return 1;
    }
  }
  int ready_fd = config.foreground ? -1 : Detach(config);
  // Signals are taken by one thread with sigwait; every other thread (the
  // logger's flusher, gRPC's, the workers) inherits the mask, so it is set before any starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  if (absl::Status s = SetUpLogging(!config.foreground, config.log_file, config.log_level);
      !s.ok()) {
    if (config.foreground) std::cerr << "kilnd: " << s.message() << "\n";
    Report(ready_fd, std::string(s.message()));
    return 1;
  }

  std::unique_ptr<compiler::Compiler> compiler = make_compiler();
  Daemon daemon(config, compiler.get());
  if (absl::Status s = daemon.Start(); !s.ok()) {
    spdlog::error("cannot start: {}", s.ToString());
    if (!config.foreground) Report(ready_fd, std::string(s.message()));  // the parent prints it
    FlushLogs();
    return 1;
  }
  spdlog::info("serving on {} (pid {}, compiler {})", config.socket_path, ::getpid(),
               compiler->Version());
  Report(ready_fd, "R");
  // The signal thread polls so that it can be joined before `daemon` goes away.
  std::atomic<bool> stopping{false};
  std::thread signal_thread([&daemon, &stopping, signals] {
    const timespec poll{0, 200'000'000};
    while (!stopping.load()) {
      if (sigtimedwait(&signals, nullptr, &poll) > 0) daemon.RequestShutdown();
    }
  });
  daemon.Wait();
  stopping = true;
  signal_thread.join();
  spdlog::info("stopped");
  FlushLogs();
  return 0;
}

}  // namespace kiln::daemon
