// The daemon's artifact MAC: HMAC-SHA256 under a secret key that never leaves the machine (or
// the cluster that shares it). A client that holds the key verifies an artifact before it loads
// anything; a client with another key refuses it.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::cache {

class Mac {
 public:
  static constexpr size_t kKeySize = 32;

  // Reads the key at `path`, or creates it (32 random bytes, mode 0600, its directory created
  // 0700 if missing) when the file does not exist. Refuses (FailedPrecondition) a key file that
  // group or others can read, or one of the wrong size.
  static absl::StatusOr<Mac> LoadOrCreate(const std::string& path);

  // A Mac over a key the caller already holds (tests, clients).
  explicit Mac(std::string key) : key_(std::move(key)) {}

  // Returns the 32-byte HMAC-SHA256 of `data`.
  std::string Sign(std::string_view data) const;

  // True when `mac` is the MAC of `data`; compares in constant time.
  bool Verify(std::string_view data, std::string_view mac) const;

  // A public name of the key (16 hex digits of a MAC over a fixed label): equal for daemons
  // that share the key, so that they share a Redis namespace, and revealing nothing of it.
  std::string Fingerprint() const;

 private:
  std::string key_;
};

// Serializes `body` and signs it.
kiln::v1::Artifact SignArtifact(const Mac& mac, const kiln::v1::ArtifactBody& body);

// Verifies the artifact's MAC and returns its parsed body. PermissionDenied when the MAC does not
// match (another key, or tampered bytes); DataLoss when the signed body does not parse.
absl::StatusOr<kiln::v1::ArtifactBody> VerifyArtifact(const Mac& mac,
                                                      const kiln::v1::Artifact& artifact);

}  // namespace kiln::cache
