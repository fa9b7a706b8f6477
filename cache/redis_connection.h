// One connection to a Redis server, over TCP (optionally TLS) or a Unix socket, speaking RESP2,
// with every step bounded in time: connecting, the TLS handshake, AUTH, and each command wait
// at most `io_timeout` for the server to make progress and never past the caller's deadline.
//
// kiln needs a handful of commands (AUTH, PING, GET, SET) with hard deadlines and TLS; the
// hiredis of Debian 12 (0.14) has no TLS and bounds only each socket read, so a server that
// trickles or stops mid-reply can hold a caller far longer than its timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kiln::cache {

// Where a Redis server is and how to authenticate to it.
struct RedisEndpoint {
  std::string host = "127.0.0.1";  // TCP host (name or address) ...
  int port = 6379;                 // ... and port,
  std::string unix_path;           // or a Unix socket path (then host and port are unused).
  std::string user;                // ACL user (Redis 6+); empty: AUTH with the password alone.
  std::string password;            // Empty: no AUTH.
  bool tls = false;                // TLS over TCP (Redis 6+ built with TLS).
  std::string tls_ca_file;         // CA certificates that verify the server; empty: system's.
  std::string tls_cert_file;       // Client certificate, for servers that ask for one.
  std::string tls_key_file;        // Its private key.
  std::string tls_server_name;     // Name the server's certificate must carry; empty: host.

  // "host:port", "unix:PATH", with "tls://" in front for TLS: for messages.
  std::string Describe() const;
};

// Parses "HOST:PORT" or "unix:PATH" into `endpoint`'s address; InvalidArgument otherwise.
absl::Status ParseRedisAddress(std::string_view address, RedisEndpoint* endpoint);

// The TLS settings shared by every connection of one store: certificates are read once.
class RedisTls {
 public:
  // Reads the CA, certificate and key files named by `endpoint`; InvalidArgument when one is
  // unusable.
  static absl::StatusOr<std::unique_ptr<RedisTls>> Create(const RedisEndpoint& endpoint);
  ~RedisTls();
  SSL_CTX* context() const { return context_; }

 private:
  explicit RedisTls(SSL_CTX* context) : context_(context) {}
  SSL_CTX* context_;
};

struct RedisReply {
  enum class Type { kString, kStatus, kError, kInteger, kNil, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

class RedisConnection {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects, does the TLS handshake (when `tls` is not null) and AUTH, each wait bounded by
  // `io_timeout` and the whole by `deadline`. Unavailable when refused or unreachable,
  // DeadlineExceeded when the server does not answer in time, PermissionDenied when AUTH fails.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Connect(
      const RedisEndpoint& endpoint, const RedisTls* tls, std::chrono::milliseconds io_timeout,
      Clock::time_point deadline);
  ~RedisConnection();

  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command (binary-safe arguments) and reads its reply. A Redis error reply is a
  // reply, not a failure. On any failure the connection is broken and must be dropped:
  // DeadlineExceeded (no progress for io_timeout, or the deadline passed), Unavailable (I/O or
  // protocol error).
  absl::StatusOr<RedisReply> Command(const std::vector<std::string_view>& args,
                                     Clock::time_point deadline);

 private:
  RedisConnection(int fd, std::chrono::milliseconds io_timeout)
      : fd_(fd), io_timeout_(io_timeout) {}
  // Waits until the socket is readable (or writable), bounded as the file comment says.
  absl::Status Wait(bool write, Clock::time_point deadline);
  absl::Status Handshake(const RedisTls& tls, const std::string& server_name,
                         Clock::time_point deadline);
  absl::Status WriteAll(std::string_view data, Clock::time_point deadline);
  // Appends what the server sent to buffer_; waits for at least one byte.
  absl::Status ReadSome(Clock::time_point deadline);

  int fd_;
  SSL* ssl_ = nullptr;
  const std::chrono::milliseconds io_timeout_;
  std::string buffer_;  // bytes received and not yet parsed
};

}  // namespace kiln::cache
