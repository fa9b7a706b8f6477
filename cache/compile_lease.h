// Fleet-wide compile leases in the shared tier, so that daemons sharing a Redis compile each key
// once: the daemon that takes a key's lease compiles it, and the others wait for its artifact.
//
// Contract: Acquire takes a key's lease with SET NX PX in this daemon's name, under
// "<namespace>:lease:<key>" (the artifacts' namespace: the MAC key's fingerprint; the key hashes
// its compiler's version), and renews it every ttl/3 on a background thread until Release, so a
// long compile keeps it and a holder that dies frees the key after ttl at most. Release deletes
// the lease only while it is still this daemon's (a compare-and-delete by script, or after a GET
// that finds it ours on a Redis without scripting), so a holder whose lease expired and passed to
// another never frees the new holder's. Every call is bounded by the tier's deadlines and circuit
// breaker; Unavailable means no one coordinates this key, and the caller compiles alone as it
// would without a shared tier. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/remote_store.h"

namespace kiln::cache {

struct CompileLeaseOptions {
  // Whose leases these are: unique in the fleet (host, process and a random part), since it is
  // all that Release compares.
  std::string holder;
  // How long a lease outlives its holder's last renewal.
  std::chrono::milliseconds ttl{10000};
};

enum class Lease {
  kOurs,    // This daemon took it: compile, publish the artifact, then Release.
  kTheirs,  // Another daemon holds it: wait for its artifact.
};

class CompileLeases {
 public:
  // `redis` must outlive the leases and must not be read-only (a daemon that never writes
  // artifacts cannot hold a lease that others wait on).
  CompileLeases(RedisStore* redis, CompileLeaseOptions options);
  // Stops renewing; leases still held expire after ttl.
  ~CompileLeases();

  CompileLeases(const CompileLeases&) = delete;
  CompileLeases& operator=(const CompileLeases&) = delete;

  // Takes `key`'s lease: kOurs (renewed until Release), kTheirs, or Unavailable.
  absl::StatusOr<Lease> Acquire(std::string_view key);
  // Gives up `key`'s lease if it is still ours, and stops renewing it. A failure is logged: the
  // lease then expires after ttl.
  void Release(std::string_view key);
  // Whether any daemon holds `key`'s lease now; Unavailable when the tier cannot tell.
  absl::StatusOr<bool> Held(std::string_view key);

  // The Redis key of `key`'s lease.
  std::string LeaseKey(std::string_view key) const;
  // How many leases this daemon holds now.
  size_t held() const;

 private:
  // Runs `command` on `lease_key` (with `extra` arguments) only while the lease is ours; true when
  // it ran and did something (an integer reply of 1).
  absl::StatusOr<bool> IfOurs(const std::string& lease_key, std::string_view command,
                              std::vector<std::string_view> extra);
  void Renew();

  RedisStore* const redis_;
  const CompileLeaseOptions options_;
  const std::string ttl_ms_;
  std::atomic<bool> scripting_{true};  // false once EVAL was refused: GET, then act

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> held_;  // cache keys whose lease is ours
  bool stopping_ = false;
  std::thread renewer_;
};

}  // namespace kiln::cache
