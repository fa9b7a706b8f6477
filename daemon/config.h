// kilnd's configuration: every setting, its default, and how flags and an optional key=value
// file set it. One DaemonConfig per process; components take the parts they need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::daemon {

struct DaemonConfig {
  // Where the artifact database and the MAC key live. Default (daemon/paths.h): $KILN_CACHE_DIR,
  // else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  std::string cache_dir;
  // The Unix socket kilnd serves on (mode 0600 in a 0700 directory). Default (daemon/paths.h):
  // $XDG_RUNTIME_DIR/kiln/kilnd.sock, else kilnd.sock in the environment's cache directory.
  std::string socket_path;
  // "host:port" for a TCP listener (given as tcp://host:port). Empty: Unix socket only. Refused
  // unless tls_cert, tls_key and token_file are all set.
  std::string listen_tcp;
  std::string tls_cert;    // PEM certificate chain for the TCP listener.
  std::string tls_key;     // PEM private key for the TCP listener.
  std::string token_file;  // File holding the bearer token TCP clients must send.
  // HMAC key for artifacts. Default: $KILN_MAC_KEY_FILE, else <cache_dir>/mac.key, created 0600
  // on first start. Daemons that share a Redis tier must share this key.
  std::string mac_key_file;
  int workers = 0;        // Compile threads; 0 = one per core.
  int queue_limit = 256;  // Compiles waiting for a worker before RESOURCE_EXHAUSTED.
  uint64_t max_request_bytes = uint64_t{64} << 20;  // Larger requests: INVALID_ARGUMENT.
  uint64_t cache_max_bytes = uint64_t{4} << 30;     // Local store limit (LRU eviction).
  int idle_exit_seconds = 0;     // Exit after this long without a request; 0 = never.
  double drain_seconds = 30;     // Longest wait for work in flight on shutdown.
  bool frozen = false;           // Serve hits and Lookup only; never compile.
  std::string redis;             // "host:port" or "unix:PATH" of the shared tier; empty = none.
  bool redis_read_only = false;  // Read the shared tier but never write it.
  // Longest wait for Redis to make progress. A hung Redis costs the calls in flight this long,
  // then is skipped (circuit open) and probed in the background until it answers again.
  int redis_timeout_ms = 500;
  // Before compiling a key no tier holds, kilnd takes the key's lease in Redis; daemons that find
  // it taken wait for the holder's artifact instead of compiling, at most this long (0: no leases,
  // each daemon compiles what it misses). At most an hour. Read-only daemons take no lease.
  int redis_lease_wait_ms = 180'000;
  // How long a lease outlives its holder's last renewal (every third of it): the longest a dead
  // holder keeps the others waiting.
  int redis_lease_ttl_ms = 10'000;
  std::string redis_user;           // ACL user for AUTH (Redis 6+); empty: password only.
  std::string redis_password_file;  // File holding the AUTH password; empty: no AUTH.
  bool redis_tls = false;           // TLS to Redis (6+, built with TLS).
  std::string redis_tls_ca;         // CA certificates for Redis's; empty: the system's.
  std::string redis_tls_cert;       // Client certificate and key, for a Redis that asks.
  std::string redis_tls_key;
  std::string redis_tls_server_name;  // Name Redis's certificate must carry; default: its host.
  // "IPv4:PORT" of the HTTP listener serving Prometheus metrics at /metrics; empty = none.
  // Unauthenticated (counters only, no secrets): keep it on loopback or a private network. A
  // port alone (or ":PORT", "localhost:PORT") means loopback; FinishConfig writes it in full.
  std::string metrics_listen;
  bool foreground = false;         // Stay attached to the terminal, log to stderr.
  std::string log_level = "warn";  // spdlog level: trace, debug, info, warn, error, off.
  // Where a detached kilnd logs (rotated; see logging.h). Default: <cache_dir>/kilnd.log.
  std::string log_file;
};

// What the kilnd command line asks for.
enum class Command { kServe, kStats, kStop, kPrintPaths, kHelp };

struct CommandLine {
  Command command = Command::kServe;
  DaemonConfig config;
};

// Parses flags (--name value or --name=value; booleans without a value). --config FILE reads
// key=value lines first ('#' starts a comment); flags override the file. Defaults are filled in
// for every path left empty.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args);

// Applies one setting by its flag name (without dashes).
absl::Status SetOption(DaemonConfig& config, const std::string& name, const std::string& value);

// Fills in the default paths and worker count, then checks the combination (TCP needs TLS and a
// token; limits positive).
absl::Status FinishConfig(DaemonConfig& config);

// The text `kilnd --print-paths` prints: the cache directory, socket, MAC key file and log file
// as `name=value` lines, the names those of the flags (so the text is also a --config file).
std::string PathsText(const DaemonConfig& config);

// The text `kilnd --help` prints.
std::string UsageText();

}  // namespace kiln::daemon
