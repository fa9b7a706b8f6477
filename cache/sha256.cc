// SHA-256 and hex encoding over OpenSSL's one-shot EVP digest.
#include "cache/sha256.h"

#include <openssl/evp.h>

namespace kiln::cache {

std::string Sha256(std::string_view data) {
  std::string digest(kSha256Size, '\0');
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(digest.data()), &len,
             EVP_sha256(), nullptr);
  return digest;
}

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

}  // namespace kiln::cache
