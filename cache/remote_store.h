// The shared tier behind the local store: a key-value service many daemons read and write, so
// a cluster compiles each graph once. Values are framed records (see record.h), checked on read.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct redisContext;

namespace kiln::cache {

// What the daemon needs from a shared tier. Get: the payload, NotFound, DataLoss (corrupt), or
// Unavailable (tier down: treated as a miss). Put: may fail; callers log and go on.
class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  virtual absl::StatusOr<std::string> Get(std::string_view key) = 0;
  virtual absl::Status Put(std::string_view key, std::string_view payload) = 0;
  virtual bool read_only() const = 0;
};

struct RedisStoreOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  // Prefix of every Redis key; the daemon appends its compiler version so that daemons of
  // different versions never read each other's artifacts.
  std::string key_namespace = "kiln:v1";
  bool read_only = false;  // Never write (a fleet that only consumes a cache warmed elsewhere).
  std::chrono::milliseconds timeout{2000};  // Connect and per-command timeout.
  // After a failed connect, calls answer Unavailable at once for this long instead of making
  // every request wait for the timeout again.
  std::chrono::milliseconds retry_after{1000};
};

// RemoteStore over one hiredis connection, reconnected on failure. Thread-safe (one command at
// a time).
class RedisStore : public RemoteStore {
 public:
  explicit RedisStore(RedisStoreOptions options);
  ~RedisStore() override;

  absl::StatusOr<std::string> Get(std::string_view key) override;
  absl::Status Put(std::string_view key, std::string_view payload) override;
  bool read_only() const override { return options_.read_only; }

  // The Redis key a cache key is stored under.
  std::string RedisKey(std::string_view key) const;

 private:
  absl::Status ConnectLocked();
  void DropLocked();

  const RedisStoreOptions options_;
  std::mutex mu_;
  redisContext* context_ = nullptr;
  std::chrono::steady_clock::time_point next_attempt_{};
};

}  // namespace kiln::cache
