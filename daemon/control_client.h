// The client side of `kilnd --stats` and `kilnd --stop`: talks to a running daemon over its
// Unix socket.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln::daemon {

// The running daemon's counters; Unavailable when none answers on `socket_path`.
absl::StatusOr<kiln::v1::StatsResponse> QueryStats(const std::string& socket_path,
                                                   std::chrono::milliseconds timeout);

// Asks the daemon to drain and waits (up to `timeout`) until it no longer answers and its
// process has exited (its database closed).
absl::Status StopDaemon(const std::string& socket_path, std::chrono::milliseconds timeout);

// Stats as "name: value" lines, for humans.
std::string FormatStats(const kiln::v1::StatsResponse& stats);

}  // namespace kiln::daemon
