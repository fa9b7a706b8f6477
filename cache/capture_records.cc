// CaptureRecords: verification of stored-capture records, and their two tiers.
#include "cache/capture_records.h"

#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cache/cache_key.h"

namespace kiln::cache {
namespace {

constexpr std::string_view kDomain("kiln-stored-capture-v1\0", 23);
constexpr size_t kTagHexDigits = 64;

std::string TagInput(std::string_view key, std::string_view payload) {
  std::string input(kDomain);
  input.append(key).push_back('\0');
  input.append(payload);
  return input;
}

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string CaptureRecords::Sign(const Mac& mac, std::string_view key, std::string_view payload) {
  std::string record = absl::BytesToHexString(mac.Sign(TagInput(key, payload)));
  record.push_back('\n');
  record.append(payload);
  return record;
}

absl::Status CaptureRecords::Verify(const Mac& mac, std::string_view key,
                                    std::string_view record) {
  if (!IsWellFormedKey(key)) return absl::InvalidArgumentError("malformed capture key");
  if (record.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("capture record of ", record.size(),
                                                   " bytes exceeds ", kMaxRecordBytes));
  }
  if (record.size() <= kTagHexDigits || record[kTagHexDigits] != '\n' ||
      !IsLowerHex(record.substr(0, kTagHexDigits))) {
    return absl::InvalidArgumentError("not a capture record (<64 hex digits>\\n<payload>)");
  }
  const std::string tag =
      absl::HexStringToBytes(std::string(record.substr(0, kTagHexDigits)));
  if (!mac.Verify(TagInput(key, record.substr(kTagHexDigits + 1)), tag)) {
    return absl::PermissionDeniedError(
        "capture record not signed for this key with this daemon's MAC key");
  }
  return absl::OkStatus();
}

std::string CaptureRecords::RemoteKey(std::string_view key) {
  return "capture:" + std::string(key);
}

absl::StatusOr<std::string> CaptureRecords::Get(std::string_view key) {
  if (!IsWellFormedKey(key)) return absl::InvalidArgumentError("malformed capture key");
  absl::StatusOr<std::string> local = local_->Get(key);
  if (local.ok()) {
    if (absl::Status s = Verify(*mac_, key, *local); s.ok()) {
      ++gets_;
      return local;
    } else {
      ++rejected_;
      spdlog::warn("dropping stored capture {}: {}", key, s.ToString());
      local_->Delete(key).IgnoreError();
    }
  } else if (!absl::IsNotFound(local.status())) {
    spdlog::warn("capture store: {}", local.status().ToString());
  }
  if (remote_ == nullptr) return absl::NotFoundError("no stored capture");
  absl::StatusOr<std::string> shared = remote_->Get(RemoteKey(key));
  if (!shared.ok()) return absl::NotFoundError("no stored capture");
  if (absl::Status s = Verify(*mac_, key, *shared); !s.ok()) {
    ++rejected_;
    spdlog::warn("ignoring shared stored capture {}: {}", key, s.ToString());
    return absl::NotFoundError("no stored capture");
  }
  if (absl::Status s = local_->Put(key, *shared); !s.ok()) {
    spdlog::error("capture store: {}", s.ToString());
  }
  ++gets_;
  ++remote_gets_;
  return shared;
}

absl::Status CaptureRecords::Put(std::string_view key, std::string_view record) {
  if (absl::Status s = Verify(*mac_, key, record); !s.ok()) {
    ++rejected_;
    return s;
  }
  absl::Status local = local_->Put(key, record);
  if (remote_ != nullptr && !remote_->read_only()) {
    if (absl::Status s = remote_->Put(RemoteKey(key), record); !s.ok()) {
      spdlog::debug("shared cache tier: {}", s.ToString());
    }
  }
  if (local.ok()) ++puts_;
  return local;
}

CaptureRecordStats CaptureRecords::Stats() const {
  return {gets_.load(), remote_gets_.load(), puts_.load(), rejected_.load()};
}

}  // namespace kiln::cache
