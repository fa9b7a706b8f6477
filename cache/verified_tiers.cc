// VerifiedTiers: local then shared reads through the owner's check, write-through, and writes.
#include "cache/verified_tiers.h"

#include <spdlog/spdlog.h>

namespace kiln::cache {

std::string VerifiedTiers::RemoteKey(std::string_view key) const {
  return remote_prefix_ + std::string(key);
}

absl::Status VerifiedTiers::GetLocal(std::string_view key, const Accept& accept) {
  absl::StatusOr<std::string> value = local_->Get(key);
  if (value.ok()) {
    absl::Status taken = accept(*value);
    if (taken.ok()) return taken;
    ++rejected_;
    spdlog::warn("dropping local {} {}: {}", what_, key, taken.ToString());
    local_->Delete(key).IgnoreError();
  } else if (value.status().code() == absl::StatusCode::kDataLoss) {
    spdlog::warn("{}", value.status().ToString());
  } else if (!absl::IsNotFound(value.status())) {
    spdlog::error("local {} store: {}", what_, value.status().ToString());
  }
  return absl::NotFoundError("not cached");
}

absl::StatusOr<CacheTier> VerifiedTiers::GetShared(std::string_view key, const Accept& accept) {
  if (remote_ == nullptr) return absl::NotFoundError("not cached");
  std::shared_ptr<Fetch> fetch;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(fetches_mu_);
    auto [it, inserted] = fetches_.try_emplace(std::string(key));
    if (inserted) it->second = std::make_shared<Fetch>();
    fetch = it->second;
    first = inserted;
  }
  if (!first) {
    {
      // The first caller's read is bounded by the tier's deadline, so this wait is too.
      std::unique_lock<std::mutex> lock(fetch->mu);
      fetch->cv.wait(lock, [&] { return fetch->done; });
    }
    if (!fetch->found) return absl::NotFoundError("not cached");
    if (GetLocal(key, accept).ok()) return CacheTier::kLocal;
    // Found, but the local store did not keep it (full, failing): read it for this caller.
    if (absl::Status s = ReadShared(key, accept); !s.ok()) return s;
    return CacheTier::kRemote;
  }
  absl::StatusOr<CacheTier> served = absl::NotFoundError("not cached");
  // A read of this key that ended since the caller's local miss wrote it through.
  if (GetLocal(key, accept).ok()) {
    served = CacheTier::kLocal;
  } else if (ReadShared(key, accept).ok()) {
    served = CacheTier::kRemote;
  }
  {
    std::lock_guard<std::mutex> lock(fetches_mu_);
    fetches_.erase(std::string(key));
  }
  {
    std::lock_guard<std::mutex> lock(fetch->mu);
    fetch->done = true;
    fetch->found = served.ok();
  }
  fetch->cv.notify_all();
  return served;
}

absl::Status VerifiedTiers::ReadShared(std::string_view key, const Accept& accept) {
  ++shared_reads_;
  absl::StatusOr<std::string> value = remote_->Get(RemoteKey(key));
  if (!value.ok()) {
    // A tier that is down says so once, when its circuit opens; its misses are quiet.
    if (absl::IsDataLoss(value.status())) {
      spdlog::warn("shared cache tier: {}", value.status().ToString());
    }
    return absl::NotFoundError("not cached");
  }
  if (absl::Status taken = accept(*value); !taken.ok()) {
    ++rejected_;
    spdlog::warn("ignoring shared {} {}: {}", what_, key, taken.ToString());
    return absl::NotFoundError("not cached");
  }
  if (absl::Status s = local_->Put(key, *value); !s.ok()) {
    spdlog::error("local {} store: {}", what_, s.ToString());
  }
  return absl::OkStatus();
}

absl::Status VerifiedTiers::Put(std::string_view key, std::string_view value) {
  absl::Status local = local_->Put(key, value);
  if (remote_ != nullptr && !remote_->read_only()) {
    if (absl::Status s = remote_->Put(RemoteKey(key), value); !s.ok()) {
      spdlog::debug("shared cache tier: {}", s.ToString());
    }
  }
  return local;
}

absl::Status VerifiedTiers::PutLocal(std::string_view key, std::string_view value) {
  return local_->Put(key, value);
}

absl::Status VerifiedTiers::PutShared(std::string_view key, std::string_view value) {
  if (remote_ == nullptr) return absl::FailedPreconditionError("no shared cache tier");
  return remote_->PutNow(RemoteKey(key), value);
}

}  // namespace kiln::cache
