// Opening an ArtifactStore in a test: the store, or a test failure and nullptr.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cache/artifact_store.h"

namespace kiln::testing {

inline std::unique_ptr<cache::ArtifactStore> OpenStore(const std::string& path,
                                                       uint64_t max_bytes = 1 << 30) {
  cache::ArtifactStoreOptions options;
  options.path = path;
  options.max_bytes = max_bytes;
  auto store = cache::ArtifactStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

}  // namespace kiln::testing
