// Stored captures in the daemon's tiers: for a capture key (a client's digest of a code object,
// kiln's build, torch's and Python's versions and the compile setting), the signed record of
// the entries a client captured for that code (client/python/kiln/stored_capture.py writes it;
// kiln/daemon/capture_store.py frames it). The daemon keeps them beside the artifacts so that a
// fresh process, or a fresh machine of a fleet sharing a Redis tier, installs them without
// tracing.
//
// A record is "<tag>\n<payload>": tag = 64 hex digits of HMAC-SHA256(MAC key,
// "kiln-stored-capture-v1\0" | capture key | "\0" | payload). The daemon never parses the payload
// (JSON that only a client reads); it stores and serves only records whose tag verifies under
// its key for the key they are stored under, so that a record altered, moved to another key or
// signed with another key is refused on the way in and dropped on the way out.
//
// Contract: Get returns a record that verifies, from the local store, else from the shared tier
// (written through to the local one), or NotFound; a local record that fails verification is
// deleted. Put refuses (PermissionDenied) a record that does not verify and (InvalidArgument) one
// larger than kMaxRecordBytes or malformed, then writes the local store and queues the shared
// write (unless the tier is read-only); it fails only when the local store fails.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/artifact_store.h"
#include "cache/mac.h"
#include "cache/remote_store.h"
#include "cache/verified_tiers.h"

namespace kiln::cache {

struct CaptureRecordStats {
  uint64_t gets = 0;         // Records served.
  uint64_t remote_gets = 0;  // Of them, from the shared tier.
  uint64_t puts = 0;         // Records stored.
  uint64_t rejected = 0;     // Records refused or dropped for failing verification.
};

class CaptureRecords {
 public:
  static constexpr size_t kMaxRecordBytes = size_t{4} << 20;

  // `local` (the daemon's capture store, not its artifact store) and `mac` must outlive this;
  // `remote` may be null.
  CaptureRecords(ArtifactStore* local, RemoteStore* remote, const Mac* mac)
      : tiers_(local, remote, "stored capture", "capture:"), mac_(mac) {}

  absl::StatusOr<std::string> Get(std::string_view key);
  absl::Status Put(std::string_view key, std::string_view record);

  // OK when `record` is a well-formed record for `key` whose tag verifies under `mac`.
  static absl::Status Verify(const Mac& mac, std::string_view key, std::string_view record);
  // The record of `payload` for `key` under `mac` (tests, tools).
  static std::string Sign(const Mac& mac, std::string_view key, std::string_view payload);

  CaptureRecordStats Stats() const;

 private:
  // The shared tier holds capture keys as "capture:<key>", apart from artifact keys.
  VerifiedTiers tiers_;
  const Mac* mac_;
  std::atomic<uint64_t> gets_{0};
  std::atomic<uint64_t> remote_gets_{0};
  std::atomic<uint64_t> puts_{0};
  std::atomic<uint64_t> refused_{0};  // Puts that did not verify (the tiers count the rest).
};

}  // namespace kiln::cache
