// The cache the daemon consults: the local ArtifactStore, then (optionally) a shared
// RemoteStore, with every artifact's MAC and key checked before it is served.
//
// Contract: Lookup returns only artifacts whose MAC verifies under this daemon's key and whose
// signed body names the key asked for; anything else (corrupt, foreign key, swapped entry) is
// dropped from the local tier and reported as a miss, so the caller recompiles. A remote hit is
// written through to the local tier; the remote tier is asked at most once per Lookup and within
// its deadline (a tier that is down or hung is a miss), and once for concurrent Lookups of one
// key (the others wait for that read and are served locally, see verified_tiers.h). Store writes
// the local tier and queues the remote write (unless read-only): a compile's answer never waits for
// the shared tier, and a remote failure is logged, never returned. A compile that holds its key's
// fleet lease (compile_lease.h) stores locally, answers, then Publishes, whose write lands before
// it returns.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/artifact_store.h"
#include "cache/mac.h"
#include "cache/remote_store.h"
#include "cache/verified_tiers.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::cache {

struct CacheHit {
  kiln::v1::Artifact artifact;
  CacheTier tier = CacheTier::kLocal;
};

// What Lookup found, by tier, since the cache was made. LookupLocal is not counted: it is a
// second look on behalf of a request whose Lookup was counted already.
struct ArtifactCacheStats {
  uint64_t local_hits = 0;     // Lookups the local store served.
  uint64_t remote_hits = 0;    // Lookups the shared tier served (after a local miss); a lookup
                               // served by a concurrent one's shared read is a local hit.
  uint64_t remote_misses = 0;  // Lookups the shared tier was asked and could not serve (absent,
                               // rejected, or the tier down or slow).
  uint64_t misses = 0;         // Lookups no tier served.
  uint64_t rejected = 0;       // Entries rejected by the MAC or key check (framing errors are
                               // counted by the store).

  uint64_t hits() const { return local_hits + remote_hits; }
  // Every lookup the local store could not serve went on to the shared tier, or missed.
  uint64_t local_misses() const { return remote_hits + misses; }
};

class ArtifactCache {
 public:
  // `local` and `mac` must outlive the cache; `remote` may be null (no shared tier).
  ArtifactCache(ArtifactStore* local, RemoteStore* remote, const Mac* mac)
      : tiers_(local, remote, "artifact"), mac_(mac) {}

  // The verified artifact for `key`, or NotFound.
  absl::StatusOr<CacheHit> Lookup(std::string_view key);
  // The same from the local tier alone: for a compile worker's second look, which only needs to
  // see what another worker stored since the first.
  absl::StatusOr<CacheHit> LookupLocal(std::string_view key);
  // The same from the shared tier alone (written through to the local tier), not counted as a
  // lookup: for a compile that waits for another daemon's artifact, or that took the key's lease
  // and looks once more before compiling. NotFound without a shared tier.
  absl::StatusOr<CacheHit> FetchShared(std::string_view key);
  // Stores a signed artifact under `key`. Fails only when the local tier fails.
  absl::Status Store(std::string_view key, const kiln::v1::Artifact& artifact);
  // The same in the local tier alone, for a compile that publishes the artifact itself.
  absl::Status StoreLocal(std::string_view key, const kiln::v1::Artifact& artifact);
  // Writes the artifact to the shared tier on the caller's thread, within the tier's deadline:
  // OK once other daemons can read it, else why not (no tier, read-only, down, slow).
  absl::Status Publish(std::string_view key, const kiln::v1::Artifact& artifact);

  ArtifactCacheStats Stats() const;
  // The shared tier's counters (zeros without one).
  RemoteStoreStats remote_stats() const {
    return tiers_.remote() != nullptr ? tiers_.remote()->Stats() : RemoteStoreStats();
  }

 private:
  absl::StatusOr<kiln::v1::Artifact> Check(std::string_view key, std::string_view payload);
  VerifiedTiers::Accept Into(std::string_view key, kiln::v1::Artifact* out);

  VerifiedTiers tiers_;
  const Mac* mac_;
  std::atomic<uint64_t> local_hits_{0};
  std::atomic<uint64_t> remote_hits_{0};
  std::atomic<uint64_t> remote_misses_{0};
  std::atomic<uint64_t> misses_{0};
};

}  // namespace kiln::cache
