// The framed record every cache tier stores: a header that lets a reader tell a whole, intact
// value from a truncated or corrupted one before it parses anything.
//
// Layout (little-endian): magic "KLNR" | u8 version | 3 zero bytes | u64 payload length |
// 32-byte SHA-256 of the payload | payload.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln::cache {

inline constexpr size_t kRecordHeaderSize = 4 + 4 + 8 + 32;

// Frames `payload` as a record.
std::string EncodeRecord(std::string_view payload);

// Returns the payload of a record, or DataLoss when the magic, version, length or checksum
// does not match (a truncated, corrupted or foreign value).
absl::StatusOr<std::string> DecodeRecord(std::string_view record);

}  // namespace kiln::cache
