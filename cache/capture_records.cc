// CaptureRecords: verification of stored-capture records, and their two tiers.
#include "cache/capture_records.h"

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
      // A tag is written as a key is: 64 lowercase hex digits.
      !IsWellFormedKey(record.substr(0, kTagHexDigits))) {
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

absl::StatusOr<std::string> CaptureRecords::Get(std::string_view key) {
  if (!IsWellFormedKey(key)) return absl::InvalidArgumentError("malformed capture key");
  std::string record;
  auto accept = [&](std::string_view value) {
    absl::Status verified = Verify(*mac_, key, value);
    if (verified.ok()) record = std::string(value);
    return verified;
  };
  if (tiers_.GetLocal(key, accept).ok()) {
    ++gets_;
    return record;
  }
  absl::StatusOr<CacheTier> tier = tiers_.GetShared(key, accept);
  if (!tier.ok()) return absl::NotFoundError("no stored capture");
  ++gets_;
  if (*tier == CacheTier::kRemote) ++remote_gets_;
  return record;
}

absl::Status CaptureRecords::Put(std::string_view key, std::string_view record) {
  if (absl::Status s = Verify(*mac_, key, record); !s.ok()) {
    ++refused_;
    return s;
  }
  absl::Status stored = tiers_.Put(key, record);
  if (stored.ok()) ++puts_;
  return stored;
}

CaptureRecordStats CaptureRecords::Stats() const {
  return {gets_.load(), remote_gets_.load(), puts_.load(), refused_.load() + tiers_.rejected()};
}

}  // namespace kiln::cache
