// The two tiers a daemon keeps signed values in (the local ArtifactStore, then an optional
// shared RemoteStore), for values only the owner can verify: artifacts (their MAC and key) and
// stored-capture records (their tag). The owner says what it accepts; the tiers drop what it
// refuses, write shared hits through to the local store, and count both.
//
// Contract: GetLocal serves a local value only if `accept` takes it, deleting (and counting as
// rejected) one it refuses; a damaged or failing store is logged and is a miss. GetShared does
// the same from the shared tier at `remote_prefix + key` (a refused value is ignored, a taken
// one written to the local store); without a shared tier, or one that is down or slow, it is a
// miss. Concurrent GetShared calls for one key make one shared read: the first reads and writes
// through, the others wait for it and are served from the local store (kLocal), so that a fleet
// of clients starting at once on a new host fetches each value once, not once per client. Put
// writes the local store and queues the shared write unless the tier is read-only; it fails only
// when the local write fails. PutShared writes the shared tier on the caller's thread, within its
// deadline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/artifact_store.h"
#include "cache/remote_store.h"

namespace kiln::cache {

// Which tier served a value.
enum class CacheTier { kLocal, kRemote };

class VerifiedTiers {
 public:
  // Checks a stored value, keeping what the caller needs of it: OK to serve it.
  using Accept = std::function<absl::Status(std::string_view value)>;

  // `local` must outlive this; `remote` may be null. `what` names the values in logs
  // ("artifact"); `remote_prefix` sets them apart from other values in the same shared tier.
  VerifiedTiers(ArtifactStore* local, RemoteStore* remote, std::string what,
                std::string remote_prefix = "")
      : local_(local),
        remote_(remote),
        what_(std::move(what)),
        remote_prefix_(std::move(remote_prefix)) {}

  // OK when served; NotFound otherwise.
  absl::Status GetLocal(std::string_view key, const Accept& accept);
  // The tier that served it (kLocal: another call's shared read of the key, or one that ended
  // since the caller's local miss, put it there); NotFound otherwise.
  absl::StatusOr<CacheTier> GetShared(std::string_view key, const Accept& accept);
  absl::Status Put(std::string_view key, std::string_view value);
  absl::Status PutLocal(std::string_view key, std::string_view value);
  // FailedPrecondition without a shared tier.
  absl::Status PutShared(std::string_view key, std::string_view value);

  // Values refused by `accept` since the tiers were made.
  uint64_t rejected() const { return rejected_.load(); }
  // Shared reads made (one per key for concurrent callers).
  uint64_t shared_reads() const { return shared_reads_.load(); }
  const RemoteStore* remote() const { return remote_; }

 private:
  // One key's shared read in progress, which later callers for the key wait for.
  struct Fetch {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool found = false;
  };

  std::string RemoteKey(std::string_view key) const;
  // Reads the shared tier, checks and writes through: OK when served.
  absl::Status ReadShared(std::string_view key, const Accept& accept);

  ArtifactStore* local_;
  RemoteStore* remote_;
  const std::string what_;
  const std::string remote_prefix_;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> shared_reads_{0};
  std::mutex fetches_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Fetch>> fetches_;
};

}  // namespace kiln::cache
