// Canonical serialization and hashing of compile requests into cache keys.
#include "cache/cache_key.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cstdint>

#include "cache/sha256.h"

namespace kiln::cache {
namespace {

std::string Deterministic(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

void AppendPart(std::string* out, std::string_view part) {
  uint64_t n = part.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(part);
}

}  // namespace

std::string CacheKey(const kiln::v1::CompileRequest& request, std::string_view compiler_version) {
  kiln::v1::CompileOptions options = request.options();
  std::sort(options.mutable_extra()->begin(), options.mutable_extra()->end(),
            [](const auto& a, const auto& b) {
              return a.key() != b.key() ? a.key() < b.key() : a.value() < b.value();
            });
  std::string canonical = "kiln.v1.cache-key";
  AppendPart(&canonical, compiler_version);
  AppendPart(&canonical, Deterministic(request.graph()));
  AppendPart(&canonical, Deterministic(request.target()));
  AppendPart(&canonical, Deterministic(options));
  return HexEncode(Sha256(canonical));
}

bool IsWellFormedKey(std::string_view key) {
  return key.size() == 2 * kSha256Size && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace kiln::cache
