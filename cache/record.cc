// Encoding and checking of framed cache records.
#include "cache/record.h"

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "cache/sha256.h"

namespace kiln::cache {
namespace {

constexpr char kMagic[4] = {'K', 'L', 'N', 'R'};
constexpr uint8_t kVersion = 1;

void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string EncodeRecord(std::string_view payload) {
  std::string out;
  out.reserve(kRecordHeaderSize + payload.size());
  out.append(kMagic, sizeof(kMagic));
  out.push_back(static_cast<char>(kVersion));
  out.append(3, '\0');
  PutFixed64(&out, payload.size());
  out.append(Sha256(payload));
  out.append(payload);
  return out;
}

absl::StatusOr<std::string> DecodeRecord(std::string_view record) {
  if (record.size() < kRecordHeaderSize) return absl::DataLossError("record shorter than header");
  if (std::memcmp(record.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("record magic mismatch");
  }
  if (static_cast<uint8_t>(record[4]) != kVersion) {
    return absl::DataLossError("unknown record version");
  }
  const uint64_t length = GetFixed64(record.data() + 8);
  if (length != record.size() - kRecordHeaderSize) {
    return absl::DataLossError("record length mismatch (truncated?)");
  }
  std::string_view checksum = record.substr(16, kSha256Size);
  std::string_view payload = record.substr(kRecordHeaderSize);
  if (Sha256(payload) != checksum) return absl::DataLossError("record checksum mismatch");
  return std::string(payload);
}

}  // namespace kiln::cache
