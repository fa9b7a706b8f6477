// libFuzzer entry for what kilnd does with request bytes before any compiler runs: decode a
// CompileRequest or LookupRequest, validate it (ValidateRequest), key it (CacheKey).
//
// Each input is tried as both message types, so a seed corpus of serialized CompileRequests and
// LookupRequests covers both RPCs. Beyond "no crash, no sanitizer report", it checks the contracts
// the daemon relies on: a rejection is INVALID_ARGUMENT; a valid request's key is 64 lowercase
// hex digits, survives a serialize/parse round trip, ignores the order of extra options and
// changes with the compiler version and the mode (a key that misses a field is a wrong hit).
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cache/cache_key.h"
#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_allowlist.h"
#include "kiln/v1/service.pb.h"
#include "tests/fuzz/fuzz_checks.h"

namespace {

using kiln::fuzz::Allowlist;
using kiln::fuzz::Check;
using kiln::v1::CompileRequest;
using kiln::v1::LookupRequest;

constexpr std::string_view kCompilerVersion = "kiln-fuzz-0";

// Spelled out here rather than trusting cache::IsWellFormedKey, which is checked against it.
bool IsLowercaseHexSha256(std::string_view key) {
  return key.size() == 64 && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string Key(const CompileRequest& request, std::string_view version = kCompilerVersion) {
  std::string key = kiln::cache::CacheKey(request, version);
  Check(IsLowercaseHexSha256(key), "cache key is not 64 lowercase hex digits:", key);
  Check(kiln::cache::IsWellFormedKey(key), "IsWellFormedKey rejects a key CacheKey made:", key);
  return key;
}

// Validates `request` as the daemon does and, when it is valid, checks its key. Returns the key
// of a valid request.
std::optional<std::string> CheckCompileRequest(const CompileRequest& request) {
  absl::Status status = kiln::compiler::ValidateRequest(request, Allowlist());
  if (!status.ok()) {
    // The service maps this code to gRPC INVALID_ARGUMENT; anything else would tell a client
    // that a malformed request is the daemon's fault.
    Check(absl::IsInvalidArgument(status), "rejection is not INVALID_ARGUMENT:", status.ToString());
    Check(!status.message().empty(), "rejection without a message");
    return std::nullopt;
  }
  const std::string key = Key(request);
  Check(Key(request) == key, "CacheKey is not deterministic");

  // What a client sends is what the daemon keys: the same request through the wire again must
  // validate and key the same.
  std::string wire;
  Check(request.SerializeToString(&wire), "valid request does not serialize");
  CompileRequest reparsed;
  Check(reparsed.ParseFromString(wire), "serialized valid request does not parse");
  absl::Status again = kiln::compiler::ValidateRequest(reparsed, Allowlist());
  Check(again.ok(), "re-parsed valid request fails validation:", again.ToString());
  Check(Key(reparsed) == key, "re-parsed valid request has another key");

  // cache_key.h: extra options are sorted before hashing, so their wire order does not matter.
  if (request.options().extra_size() > 1) {
    CompileRequest reordered = request;
    auto* extra = reordered.mutable_options()->mutable_extra();
    std::reverse(extra->begin(), extra->end());
    Check(Key(reordered) == key, "order of extra options changes the key");
  }

  // Fields the key must cover.
  Check(Key(request, "kiln-fuzz-1") != key, "compiler version is not in the key");
  CompileRequest other_mode = request;
  other_mode.mutable_options()->set_mode(request.options().mode() + "x");
  Check(Key(other_mode) != key, "compile mode is not in the key");
  return key;
}

void CheckLookupRequest(const LookupRequest& lookup) {
  switch (lookup.by_case()) {
    case LookupRequest::kKey:
      Check(kiln::cache::IsWellFormedKey(lookup.key()) == IsLowercaseHexSha256(lookup.key()),
            "IsWellFormedKey disagrees on a lookup key");
      break;
    case LookupRequest::kRequest:
      CheckCompileRequest(lookup.request());
      break;
    case LookupRequest::BY_NOT_SET:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every proto3 string with invalid UTF-8 it refuses to parse; the fuzzer makes
  // millions. The parse failure itself is what the daemon acts on.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > static_cast<size_t>(INT_MAX)) return 0;
  const int n = static_cast<int>(size);
  CompileRequest request;
  if (request.ParseFromArray(data, n)) CheckCompileRequest(request);
  LookupRequest lookup;
  if (lookup.ParseFromArray(data, n)) CheckLookupRequest(lookup);
  return 0;
}
