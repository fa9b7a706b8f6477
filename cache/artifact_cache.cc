// ArtifactCache: local then remote lookup, verification, write-through, and their counts.
#include "cache/artifact_cache.h"

#include <spdlog/spdlog.h>

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

absl::StatusOr<CacheHit> ArtifactCache::LookupLocal(std::string_view key) {
  absl::StatusOr<std::string> payload = local_->Get(key);
  if (payload.ok()) {
    absl::StatusOr<kiln::v1::Artifact> artifact = Check(key, *payload);
    if (artifact.ok()) return CacheHit{*std::move(artifact), CacheTier::kLocal};
    ++rejected_;
    spdlog::warn("dropping local artifact {}: {}", key, artifact.status().ToString());
    local_->Delete(key).IgnoreError();
  } else if (payload.status().code() == absl::StatusCode::kDataLoss) {
    spdlog::warn("{}", payload.status().ToString());
  } else if (!absl::IsNotFound(payload.status())) {
    spdlog::error("local artifact store: {}", payload.status().ToString());
  }
  return absl::NotFoundError("not cached");
}

absl::StatusOr<CacheHit> ArtifactCache::Lookup(std::string_view key) {
  if (absl::StatusOr<CacheHit> hit = LookupLocal(key); hit.ok()) {
    ++local_hits_;
    return hit;
  }
  if (remote_ == nullptr) {
    ++misses_;
    return absl::NotFoundError("not cached");
  }
  absl::StatusOr<CacheHit> hit = FetchShared(key);
  if (hit.ok()) {
    ++remote_hits_;
  } else {
    ++remote_misses_;
    ++misses_;
  }
  return hit;
}

absl::StatusOr<CacheHit> ArtifactCache::FetchShared(std::string_view key) {
  if (remote_ == nullptr) return absl::NotFoundError("not cached");
  absl::StatusOr<std::string> payload = remote_->Get(key);
  if (!payload.ok()) {
    // A tier that is down says so once, when its circuit opens; its misses are quiet.
    if (absl::IsDataLoss(payload.status())) {
      spdlog::warn("shared cache tier: {}", payload.status().ToString());
    }
    return absl::NotFoundError("not cached");
  }
  absl::StatusOr<kiln::v1::Artifact> artifact = Check(key, *payload);
  if (!artifact.ok()) {
    ++rejected_;
    spdlog::warn("ignoring shared artifact {}: {}", key, artifact.status().ToString());
    return absl::NotFoundError("not cached");
  }
  if (absl::Status s = local_->Put(key, *payload); !s.ok()) {
    spdlog::error("local artifact store: {}", s.ToString());
  }
  return CacheHit{*std::move(artifact), CacheTier::kRemote};
}

ArtifactCacheStats ArtifactCache::Stats() const {
  ArtifactCacheStats stats;
  stats.local_hits = local_hits_.load();
  stats.remote_hits = remote_hits_.load();
  stats.remote_misses = remote_misses_.load();
  stats.misses = misses_.load();
  stats.rejected = rejected_.load();
  return stats;
}

absl::Status ArtifactCache::Store(std::string_view key, const kiln::v1::Artifact& artifact) {
  std::string payload = artifact.SerializeAsString();
  absl::Status local = local_->Put(key, payload);
  if (remote_ != nullptr && !remote_->read_only()) {
    if (absl::Status s = remote_->Put(key, payload); !s.ok()) {
      spdlog::debug("shared cache tier: {}", s.ToString());
    }
  }
  return local;
}

absl::Status ArtifactCache::StoreLocal(std::string_view key, const kiln::v1::Artifact& artifact) {
  return local_->Put(key, artifact.SerializeAsString());
}

absl::Status ArtifactCache::Publish(std::string_view key, const kiln::v1::Artifact& artifact) {
  if (remote_ == nullptr) return absl::FailedPreconditionError("no shared cache tier");
  return remote_->PutNow(key, artifact.SerializeAsString());
}

}  // namespace kiln::cache
