// SHA-256 and hex encoding (OpenSSL). Used for cache keys and record checksums.
#pragma once

#include <string>
#include <string_view>

namespace kiln::cache {

inline constexpr size_t kSha256Size = 32;

// Returns the 32-byte SHA-256 digest of `data`.
std::string Sha256(std::string_view data);

// Returns `bytes` as lowercase hex.
std::string HexEncode(std::string_view bytes);

}  // namespace kiln::cache
