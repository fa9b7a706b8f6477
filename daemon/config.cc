// Flag and config-file parsing for kilnd, with default paths from the environment (paths.h).
#include "daemon/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/paths.h"

namespace kiln::daemon {
namespace {

bool IsBoolFlag(const std::string& name) {
  return name == "frozen" || name == "foreground" || name == "redis-read-only" ||
         name == "redis-tls";
}

// Options that take a value; SetOption handles each of them.
bool IsValueFlag(const std::string& name) {
  static const std::set<std::string> kNames = {"config",
                                               "cache-dir",
                                               "socket",
                                               "listen",
                                               "tls-cert",
                                               "tls-key",
                                               "token-file",
                                               "mac-key-file",
                                               "workers",
                                               "queue-limit",
                                               "max-request-bytes",
                                               "cache-max-bytes",
                                               "idle-exit",
                                               "drain-seconds",
                                               "redis",
                                               "log-level",
                                               "log-file",
                                               "redis-timeout-ms",
                                               "redis-lease-wait-ms",
                                               "redis-lease-ttl-ms",
                                               "redis-user",
                                               "redis-password-file",
                                               "redis-tls-ca",
                                               "redis-tls-cert",
                                               "redis-tls-key",
                                               "redis-tls-server-name",
                                               "metrics-listen"};
  return kNames.count(name) != 0;
}

absl::Status ParseBool(const std::string& value, bool* out) {
  if (value == "" || value == "1" || value == "true" || value == "yes") {
    *out = true;
  } else if (value == "0" || value == "false" || value == "no") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("not a boolean: ", value));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ParseNumber(const std::string& name, const std::string& value, T* out) {
  if constexpr (std::is_same_v<T, double>) {
    if (!absl::SimpleAtod(value, out)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": not a number: ", value));
    }
  } else {
    if (!absl::SimpleAtoi(value, out)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": not an integer: ", value));
    }
  }
  return absl::OkStatus();
}

// The metrics listener's address as civetweb must be given it: "IPv4:PORT". civetweb itself
// reads a port alone as every interface and a malformed address as some other one, so kilnd
// checks the address and spells loopback out.
absl::StatusOr<std::string> MetricsAddress(const std::string& value) {
  auto refuse = [&value](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", value, ": ", why, "; expected [IPV4:]PORT"));
  };
  absl::string_view host, port = value;
  if (size_t colon = port.rfind(':'); colon != absl::string_view::npos) {
    host = port.substr(0, colon);
    port.remove_prefix(colon + 1);
  }
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  in_addr parsed{};
  if (::inet_pton(AF_INET, std::string(host).c_str(), &parsed) != 1) {
    return refuse("not an IPv4 address (no IPv6, no host names but localhost)");
  }
  uint32_t number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &number) || number > 65535) {
    return refuse("not a port number");
  }
  return absl::StrCat(host, ":", number);
}

absl::Status ReadConfigFile(DaemonConfig& config, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::string_view text = line;
    if (size_t hash = text.find('#'); hash != std::string_view::npos) text = text.substr(0, hash);
    std::string stripped(absl::StripAsciiWhitespace(std::string(text)));
    if (stripped.empty()) continue;
    size_t eq = stripped.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": expected key=value"));
    }
    std::string key(absl::StripAsciiWhitespace(stripped.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(stripped.substr(eq + 1)));
    std::replace(key.begin(), key.end(), '_', '-');
    if (absl::Status s = SetOption(config, key, value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetOption(DaemonConfig& c, const std::string& name, const std::string& value) {
  if (name == "cache-dir")
    c.cache_dir = value;
  else if (name == "socket")
    c.socket_path = value;
  else if (name == "listen") {
    absl::string_view v = value;
    if (absl::ConsumePrefix(&v, "unix://")) {
      c.socket_path = std::string(v);
    } else if (absl::ConsumePrefix(&v, "tcp://")) {
      if (v.find(':') == std::string_view::npos) {
        return absl::InvalidArgumentError("--listen tcp://HOST:PORT needs a port");
      }
      c.listen_tcp = std::string(v);
    } else {
      return absl::InvalidArgumentError("--listen takes tcp://HOST:PORT or unix://PATH");
    }
  } else if (name == "tls-cert")
    c.tls_cert = value;
  else if (name == "tls-key")
    c.tls_key = value;
  else if (name == "token-file")
    c.token_file = value;
  else if (name == "mac-key-file")
    c.mac_key_file = value;
  else if (name == "workers")
    return ParseNumber(name, value, &c.workers);
  else if (name == "queue-limit")
    return ParseNumber(name, value, &c.queue_limit);
  else if (name == "max-request-bytes")
    return ParseNumber(name, value, &c.max_request_bytes);
  else if (name == "cache-max-bytes")
    return ParseNumber(name, value, &c.cache_max_bytes);
  else if (name == "idle-exit")
    return ParseNumber(name, value, &c.idle_exit_seconds);
  else if (name == "drain-seconds")
    return ParseNumber(name, value, &c.drain_seconds);
  else if (name == "frozen")
    return ParseBool(value, &c.frozen);
  else if (name == "foreground")
    return ParseBool(value, &c.foreground);
  else if (name == "redis")
    c.redis = value;
  else if (name == "redis-read-only")
    return ParseBool(value, &c.redis_read_only);
  else if (name == "redis-timeout-ms")
    return ParseNumber(name, value, &c.redis_timeout_ms);
  else if (name == "redis-lease-wait-ms")
    return ParseNumber(name, value, &c.redis_lease_wait_ms);
  else if (name == "redis-lease-ttl-ms")
    return ParseNumber(name, value, &c.redis_lease_ttl_ms);
  else if (name == "redis-user")
    c.redis_user = value;
  else if (name == "redis-password-file")
    c.redis_password_file = value;
  else if (name == "redis-tls")
    return ParseBool(value, &c.redis_tls);
  else if (name == "redis-tls-ca")
    c.redis_tls_ca = value;
  else if (name == "redis-tls-cert")
    c.redis_tls_cert = value;
  else if (name == "redis-tls-key")
    c.redis_tls_key = value;
  else if (name == "redis-tls-server-name")
    c.redis_tls_server_name = value;
  else if (name == "log-level")
    c.log_level = value;
  else if (name == "log-file")
    c.log_file = value;
  else if (name == "metrics-listen")
    c.metrics_listen = value;
  else
    return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
  return absl::OkStatus();
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine result;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_file;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", args[i]));
    }
    std::string name(arg), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "stats") {
      result.command = Command::kStats;
      continue;
    }
    if (name == "stop") {
      result.command = Command::kStop;
      continue;
    }
    if (name == "print-paths") {
      result.command = Command::kPrintPaths;
      continue;
    }
    if (name == "help") {
      result.command = Command::kHelp;
      continue;
    }
    if (!IsValueFlag(name) && !IsBoolFlag(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    }
    if (!has_value && !IsBoolFlag(name)) {
      if (i + 1 >= args.size())
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    if (name == "config")
      config_file = value;
    else
      flags.emplace_back(name, value);
  }
  if (!config_file.empty()) {
    if (absl::Status s = ReadConfigFile(result.config, config_file); !s.ok()) return s;
  }
  for (const auto& [name, value] : flags) {
    if (absl::Status s = SetOption(result.config, name, value); !s.ok()) return s;
  }
  if (absl::Status s = FinishConfig(result.config); !s.ok()) return s;
  return result;
}

absl::Status FinishConfig(DaemonConfig& c) {
  paths::KilnPaths paths = paths::ResolvePaths(
      {c.cache_dir, c.socket_path, c.mac_key_file, c.log_file}, paths::ProcessEnvironment());
  c.cache_dir = paths.cache_dir;
  c.socket_path = paths.socket;
  c.mac_key_file = paths.mac_key_file;
  c.log_file = paths.log_file;
  // Absolute, because a detached kilnd runs from "/".
  for (std::string* path : {&c.tls_cert, &c.tls_key, &c.token_file, &c.redis_password_file,
                            &c.redis_tls_ca, &c.redis_tls_cert, &c.redis_tls_key}) {
    *path = paths::AbsolutePath(*path);
  }
  if (c.workers <= 0) c.workers = std::max(1u, std::thread::hardware_concurrency());
  if (c.queue_limit <= 0) return absl::InvalidArgumentError("--queue-limit must be positive");
  if (c.max_request_bytes == 0)
    return absl::InvalidArgumentError("--max-request-bytes must be positive");
  static const std::set<std::string> kLevels = {"trace", "debug",    "info", "warn",
                                                "error", "critical", "off"};
  if (!kLevels.count(c.log_level)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown --log-level ", c.log_level));
  }
  if (c.idle_exit_seconds < 0) return absl::InvalidArgumentError("--idle-exit must be >= 0");
  if (!c.listen_tcp.empty() && (c.tls_cert.empty() || c.tls_key.empty() || c.token_file.empty())) {
    return absl::InvalidArgumentError(
        "refusing a TCP listener without --tls-cert, --tls-key and --token-file");
  }
  if (c.redis_timeout_ms <= 0)
    return absl::InvalidArgumentError("--redis-timeout-ms must be positive");
  // Never a client stalled for good on another daemon's compile.
  if (c.redis_lease_wait_ms < 0 || c.redis_lease_wait_ms > 3'600'000) {
    return absl::InvalidArgumentError("--redis-lease-wait-ms must be from 0 to 3600000 (an hour)");
  }
  if (c.redis_lease_ttl_ms < 100) {
    return absl::InvalidArgumentError("--redis-lease-ttl-ms must be at least 100");
  }
  const bool redis_extras = c.redis_tls || !c.redis_user.empty() || !c.redis_password_file.empty();
  if (c.redis.empty() && redis_extras) {
    return absl::InvalidArgumentError(
        "--redis-tls, --redis-user and --redis-password-file need --redis");
  }
  if (c.redis_tls_cert.empty() != c.redis_tls_key.empty()) {
    return absl::InvalidArgumentError("--redis-tls-cert and --redis-tls-key go together");
  }
  if (!c.metrics_listen.empty()) {
    absl::StatusOr<std::string> address = MetricsAddress(c.metrics_listen);
    if (!address.ok()) return address.status();
    c.metrics_listen = *std::move(address);
  }
  if (c.socket_path.size() >= 100) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", c.socket_path));
  }
  return absl::OkStatus();
}

std::string PathsText(const DaemonConfig& c) {
  return absl::StrCat("cache-dir=", c.cache_dir, "\nsocket=", c.socket_path,
                      "\nmac-key-file=", c.mac_key_file, "\nlog-file=", c.log_file, "\n");
}

std::string UsageText() {
  return R"(kilnd: the kiln compile daemon.

  kilnd [--foreground] [options]   serve (detaches unless --foreground)
  kilnd --stats [--socket PATH]    print the running daemon's counters
  kilnd --stop [--socket PATH]     drain and stop the running daemon
  kilnd --print-paths [options]    print the cache directory, socket, MAC key and log file
                                   (name=value lines) that these options and the environment
                                   give; the client computes its paths by the same code

Options (also accepted as key=value lines in --config FILE, '-' or '_' in keys):
  --cache-dir DIR          artifact database and MAC key (default $KILN_CACHE_DIR, else
                           $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)
  --socket PATH            Unix socket (default $XDG_RUNTIME_DIR/kiln/kilnd.sock; with
                           $KILN_CACHE_DIR set or no XDG_RUNTIME_DIR, kilnd.sock in the cache dir)
  --listen tcp://HOST:PORT also serve TCP; needs --tls-cert, --tls-key, --token-file
  --mac-key-file PATH      artifact HMAC key (default $KILN_MAC_KEY_FILE, else <cache-dir>/mac.key)
  --workers N              compile threads (default: cores)
  --queue-limit N          waiting compiles before RESOURCE_EXHAUSTED (256)
  --max-request-bytes N    larger requests are INVALID_ARGUMENT (64 MiB)
  --cache-max-bytes N      local store size limit, LRU eviction (4 GiB)
  --idle-exit SECONDS      exit after this long without requests (0: never)
  --drain-seconds S        longest wait for work in flight on shutdown (30)
  --frozen                 serve cached artifacts only, never compile
  --redis HOST:PORT        shared cache tier (or unix:PATH); --redis-read-only to never write it
  --redis-timeout-ms MS    longest wait for Redis to answer before it is skipped (500)
  --redis-lease-wait-ms MS longest wait for another kilnd's compile of a key whose lease it
                           holds in Redis, then compile here (180000; 0: no leases)
  --redis-lease-ttl-ms MS  a lease outlives its holder's last renewal this long (10000)
  --redis-user NAME        AUTH as this ACL user (Redis 6+), with --redis-password-file FILE
  --redis-tls              TLS to Redis; --redis-tls-ca FILE (default: system CAs),
                           --redis-tls-cert/--redis-tls-key FILE, --redis-tls-server-name NAME
  --log-level LEVEL        trace|debug|info|warn|error|off (warn)
  --log-file PATH          where a detached kilnd logs, rotated at 4 MiB, 3 kept
                           (default <cache-dir>/kilnd.log; --foreground logs to stderr,
                           in the journal's format under systemd)
  --metrics-listen [IPV4:]PORT
                           serve Prometheus metrics over HTTP at /metrics (default: off; a
                           port alone binds 127.0.0.1). Unauthenticated plain HTTP exposing
                           counters only: keep it on loopback or a private network
)";
}

}  // namespace kiln::daemon
