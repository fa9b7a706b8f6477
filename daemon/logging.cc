// SetUpLogging: spdlog sinks for the terminal, the journal and the rotated log file, and gRPC's
// log function routed into them.
#include "daemon/logging.h"

#include <fcntl.h>
#include <grpc/support/log.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace kiln::daemon {
namespace {

// True when stderr is the journal's stream: JOURNAL_STREAM is "<device>:<inode>" of it.
bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  struct stat st {};
  if (::fstat(2, &st) != 0) return false;
  unsigned long long dev = 0, ino = 0;
  return std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && dev == st.st_dev && ino == st.st_ino;
}

// Lines to stderr prefixed with their syslog priority, which journald reads as the level.
class JournalSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    int priority = 6;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        priority = 7;
        break;
      case spdlog::level::info:
        priority = 6;
        break;
      case spdlog::level::warn:
        priority = 4;
        break;
      case spdlog::level::err:
        priority = 3;
        break;
      default:
        priority = 2;
    }
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    std::fprintf(stderr, "<%d>%.*s", priority, static_cast<int>(formatted.size()),
                 formatted.data());
  }
  void flush_() override { std::fflush(stderr); }
};

void LogFromGrpc(gpr_log_func_args* args) {
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      spdlog::debug("grpc: {}", args->message);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::info("grpc: {}", args->message);
      break;
    default:
      spdlog::error("grpc: {}", args->message);
  }
}

}  // namespace

absl::Status RedirectStderrTo(const std::string& log_file) {
  int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open the log file ", log_file, ": ", std::strerror(errno)));
  }
  ::dup2(fd, 2);
  ::close(fd);
  return absl::OkStatus();
}

absl::Status SetUpLogging(bool detached, const std::string& log_file, const std::string& level) {
  std::shared_ptr<spdlog::logger> logger;
  try {
    if (detached) {
      logger = std::make_shared<spdlog::logger>(
          "kilnd", std::make_shared<spdlog::sinks::rotating_file_sink_mt>(log_file, kLogFileBytes,
                                                                          kLogFilesKept));
      logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %l [%P] %v");
    } else if (StderrIsJournal()) {
      logger = std::make_shared<spdlog::logger>("kilnd", std::make_shared<JournalSink>());
      logger->set_pattern("%v");
    } else {
      logger = std::make_shared<spdlog::logger>("kilnd",
                                                std::make_shared<spdlog::sinks::stderr_sink_mt>());
      logger->set_pattern("kilnd %Y-%m-%d %H:%M:%S.%e %l: %v");
    }
  } catch (const spdlog::spdlog_ex& e) {
    return absl::UnavailableError(absl::StrCat("cannot log to ", log_file, ": ", e.what()));
  }
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);  // a healthy kilnd logs a line at start and stop
  spdlog::set_default_logger(logger);
  spdlog::flush_every(std::chrono::seconds(1));
  gpr_set_log_function(LogFromGrpc);
  return absl::OkStatus();
}

void FlushLogs() { spdlog::default_logger()->flush(); }

}  // namespace kiln::daemon
