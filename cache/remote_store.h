// The shared tier behind the local store: a key-value service many daemons read and write, so
// a cluster compiles each graph once. Values are framed records (see record.h), checked on read.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/circuit_breaker.h"
#include "cache/redis_connection.h"

namespace kiln::cache {

struct RemoteStoreStats {
  uint64_t errors = 0;          // Calls that failed or timed out.
  uint64_t skipped = 0;         // Calls not made because the tier was known to be down.
  uint64_t writes = 0;          // Values written.
  uint64_t writes_dropped = 0;  // Values not written (tier down, or too many waiting).
  bool down = false;            // The tier is considered down now (circuit open).
};

// What the daemon needs from a shared tier. Get: the payload, NotFound, DataLoss (corrupt), or
// Unavailable (tier down or slow: treated as a miss), within the tier's deadline. Put: queues
// the value for writing off the caller's thread; a value that cannot be written is dropped and
// counted, never retried by the caller. PutNow: writes on the caller's thread, within the tier's
// deadline, for a writer that must know the value is readable before it goes on (a compile whose
// lease other daemons wait on, see compile_lease.h); a failure is counted as a dropped value.
class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  virtual absl::StatusOr<std::string> Get(std::string_view key) = 0;
  virtual absl::Status Put(std::string_view key, std::string_view payload) = 0;
  virtual absl::Status PutNow(std::string_view key, std::string_view payload) = 0;
  virtual bool read_only() const = 0;
  virtual RemoteStoreStats Stats() const = 0;
};

struct RedisStoreOptions {
  RedisEndpoint endpoint;
  // Prefix of every Redis key; the daemon appends its compiler version and its MAC key's
  // fingerprint, so that daemons of another version or key never read or overwrite its entries.
  std::string key_namespace = "kiln:v1";
  bool read_only = false;  // Never write (a fleet that only consumes a cache warmed elsewhere).
  // Longest wait for Redis to make progress (connect, handshake, each step of a command); a
  // silent server costs a call at most this long, and opens the circuit.
  std::chrono::milliseconds timeout{500};
  // Longest whole command (a large artifact over a slow link makes progress for a while).
  std::chrono::milliseconds command_deadline{30000};
  // Once the circuit is open, the first probe comes after retry_after, then twice as long after
  // each failed probe, up to max_retry_after.
  std::chrono::milliseconds retry_after{1000};
  std::chrono::milliseconds max_retry_after{10000};
  size_t idle_connections = 8;                // Connections kept open between calls.
  uint64_t write_queue_bytes = 256ull << 20;  // Values waiting to be written, at most.
};

// RemoteStore over Redis: GETs on the caller's thread over a pool of connections (calls do not
// wait for one another), SETs and probes of a tier that is down on one background thread.
// Other commands (the compile leases') go through Run, under the same deadlines and breaker.
class RedisStore : public RemoteStore {
 public:
  // Reads the TLS files the options name; InvalidArgument when one is unusable. Connects lazily.
  static absl::StatusOr<std::unique_ptr<RedisStore>> Create(RedisStoreOptions options);
  // Values still queued are dropped.
  ~RedisStore() override;

  absl::StatusOr<std::string> Get(std::string_view key) override;
  absl::Status Put(std::string_view key, std::string_view payload) override;
  absl::Status PutNow(std::string_view key, std::string_view payload) override;
  bool read_only() const override { return options_.read_only; }
  RemoteStoreStats Stats() const override;

  // Waits until every value queued so far has been written or dropped.
  void Flush();
  // The Redis key a cache key is stored under.
  std::string RedisKey(std::string_view key) const;
  // One command on the caller's thread, on a pooled (or new) connection, within the deadlines
  // above. Unavailable at once while the circuit is open; a failure opens it. A Redis error
  // reply is a reply, not a failure.
  absl::StatusOr<RedisReply> Run(const std::vector<std::string_view>& args);

 private:
  using Clock = RedisConnection::Clock;

  RedisStore(RedisStoreOptions options, std::unique_ptr<RedisTls> tls);
  // The same as Run, for probes and writes on the background thread: no circuit check.
  absl::StatusOr<RedisReply> RunUnchecked(const std::vector<std::string_view>& args);
  // SET of one framed record, and what became of it (an error reply is Unavailable).
  absl::Status Set(const std::string& redis_key, const std::string& record);
  void Failed(const absl::Status& status);
  void Background();

  const RedisStoreOptions options_;
  const std::unique_ptr<RedisTls> tls_;
  CircuitBreaker breaker_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> queue_;  // redis key, record
  uint64_t queued_bytes_ = 0;
  bool writing_ = false;
  bool stopping_ = false;
  RemoteStoreStats stats_;
  std::thread background_;
};

}  // namespace kiln::cache
