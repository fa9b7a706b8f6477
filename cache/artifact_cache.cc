// ArtifactCache: local then remote lookup, verification, write-through, and their counts.
#include "cache/artifact_cache.h"

#include "absl/strings/str_cat.h"

namespace kiln::cache {

absl::StatusOr<kiln::v1::Artifact> ArtifactCache::Check(std::string_view key,
                                                        std::string_view payload) {
  kiln::v1::Artifact artifact;
  if (!artifact.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("stored artifact does not parse");
  }
  absl::StatusOr<kiln::v1::ArtifactBody> body = VerifyArtifact(*mac_, artifact);
  if (!body.ok()) return body.status();
  if (body->key() != key) {
    return absl::PermissionDeniedError(absl::StrCat("stored artifact is signed for key ",
                                                    body->key(), ", not ", std::string(key)));
  }
  return artifact;
}

// The accept function for the tiers: verifies `value` as the artifact of `key` into *out.
VerifiedTiers::Accept ArtifactCache::Into(std::string_view key, kiln::v1::Artifact* out) {
  return [this, key, out](std::string_view value) -> absl::Status {
    absl::StatusOr<kiln::v1::Artifact> artifact = Check(key, value);
    if (!artifact.ok()) return artifact.status();
    *out = *std::move(artifact);
    return absl::OkStatus();
  };
}

absl::StatusOr<CacheHit> ArtifactCache::LookupLocal(std::string_view key) {
  CacheHit hit{kiln::v1::Artifact(), CacheTier::kLocal};
  if (absl::Status s = tiers_.GetLocal(key, Into(key, &hit.artifact)); !s.ok()) return s;
  return hit;
}

absl::StatusOr<CacheHit> ArtifactCache::Lookup(std::string_view key) {
  if (absl::StatusOr<CacheHit> hit = LookupLocal(key); hit.ok()) {
    ++local_hits_;
    return hit;
  }
  if (tiers_.remote() == nullptr) {
    ++misses_;
    return absl::NotFoundError("not cached");
  }
  absl::StatusOr<CacheHit> hit = FetchShared(key);
  if (hit.ok()) {
    // Served locally when a concurrent lookup of the key fetched it for both.
    ++(hit->tier == CacheTier::kRemote ? remote_hits_ : local_hits_);
  } else {
    ++remote_misses_;
    ++misses_;
  }
  return hit;
}

absl::StatusOr<CacheHit> ArtifactCache::FetchShared(std::string_view key) {
  CacheHit hit;
  absl::StatusOr<CacheTier> tier = tiers_.GetShared(key, Into(key, &hit.artifact));
  if (!tier.ok()) return tier.status();
  hit.tier = *tier;
  return hit;
}

ArtifactCacheStats ArtifactCache::Stats() const {
  ArtifactCacheStats stats;
  stats.local_hits = local_hits_.load();
  stats.remote_hits = remote_hits_.load();
  stats.remote_misses = remote_misses_.load();
  stats.misses = misses_.load();
  stats.rejected = tiers_.rejected();
  return stats;
}

absl::Status ArtifactCache::Store(std::string_view key, const kiln::v1::Artifact& artifact) {
  return tiers_.Put(key, artifact.SerializeAsString());
}

absl::Status ArtifactCache::StoreLocal(std::string_view key, const kiln::v1::Artifact& artifact) {
  return tiers_.PutLocal(key, artifact.SerializeAsString());
}

absl::Status ArtifactCache::Publish(std::string_view key, const kiln::v1::Artifact& artifact) {
  return tiers_.PutShared(key, artifact.SerializeAsString());
}

}  // namespace kiln::cache
