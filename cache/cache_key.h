// The cache key: what decides whether two compile requests may share one artifact. It covers
// everything that changes the output (graph with all tensor metadata, target, options, compiler
// version); a key that misses something is a wrong hit, the worst bug kiln can have.
#pragma once

#include <string>
#include <string_view>

#include "kiln/v1/service.pb.h"

namespace kiln::cache {

// Returns the lowercase hex SHA-256 of the canonical form of the request's parts: each part is
// serialized deterministically and length-prefixed; extra options are sorted by key first.
std::string CacheKey(const kiln::v1::CompileRequest& request, std::string_view compiler_version);

// True when `key` looks like a key CacheKey returns (64 lowercase hex digits).
bool IsWellFormedKey(std::string_view key);

}  // namespace kiln::cache
