// kilnd's one logger (spdlog's default logger) and where its lines go:
//  - in the foreground, to stderr; when stderr is the systemd journal (JOURNAL_STREAM names
//    it), each line carries its syslog priority ("<4>...") and no timestamp, which the journal
//    records itself;
//  - detached, to the log file (default <cache dir>/kilnd.log, mode 0600), rotated at
//    kLogFileBytes with kLogFilesKept older files; the process's stderr is appended to the same
//    file, so that a library's message or a crash report is kept too.
// gRPC's own log lines go through the same logger.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace kiln::daemon {

inline constexpr size_t kLogFileBytes = size_t{4} << 20;
inline constexpr size_t kLogFilesKept = 3;

// Points stderr (fd 2) at `log_file`, appending: what a detached kilnd writes there is kept.
absl::Status RedirectStderrTo(const std::string& log_file);

// Installs the logger at `level` (trace, debug, info, warn, error, critical, off): to the
// rotating `log_file` when `detached`, else to stderr (journal format under systemd).
absl::Status SetUpLogging(bool detached, const std::string& log_file, const std::string& level);

// Writes out what the logger holds; call before exit.
void FlushLogs();

}  // namespace kiln::daemon
