// The two tiers a daemon keeps signed values in (the local ArtifactStore, then an optional
// shared RemoteStore), for values only the owner can verify: artifacts (their MAC and key) and
// stored-capture records (their tag). The owner says what it accepts; the tiers drop what it
// refuses, write shared hits through to the local store, and count both.
//
// Contract: GetLocal serves a local value only if `accept` takes it, deleting (and counting as
// rejected) one it refuses; a damaged or failing store is logged and is a miss. GetShared does
// the same from the shared tier at `remote_prefix + key` (a refused value is ignored, a taken
// one written to the local store); without a shared tier, or one that is down or slow, it is a
// miss. Put writes the local store and queues the shared write unless the tier is read-only; it
// fails only when the local write fails. PutShared writes the shared tier on the caller's
// thread, within its deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cache/artifact_store.h"
#include "cache/remote_store.h"

namespace kiln::cache {

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
  absl::Status GetShared(std::string_view key, const Accept& accept);
  absl::Status Put(std::string_view key, std::string_view value);
  absl::Status PutLocal(std::string_view key, std::string_view value);
  // FailedPrecondition without a shared tier.
  absl::Status PutShared(std::string_view key, std::string_view value);

  // Values refused by `accept` since the tiers were made.
  uint64_t rejected() const { return rejected_.load(); }
  const RemoteStore* remote() const { return remote_; }

 private:
  std::string RemoteKey(std::string_view key) const;

  ArtifactStore* local_;
  RemoteStore* remote_;
  const std::string what_;
  const std::string remote_prefix_;
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace kiln::cache
