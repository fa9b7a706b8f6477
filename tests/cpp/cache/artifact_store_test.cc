// ArtifactStore over a real RocksDB in a temporary directory: persistence, corruption
// detection, LRU eviction under the byte limit.
#include "cache/artifact_store.h"

#include <gtest/gtest.h>

#include "cache/record.h"
#include "tests/cpp/support/artifact_store_for_tests.h"
#include "tests/cpp/support/tamper.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

using kiln::testing::OpenStore;

TEST(ArtifactStore, GetReturnsWhatPutStoredAndMissIsNotFound) {
  testing::TempDir dir;
  auto store = OpenStore(dir.Sub("db"));
  ASSERT_TRUE(store->Put("k1", "payload-1").ok());
  auto got = store->Get("k1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "payload-1");
  EXPECT_EQ(store->Get("k2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().entries, 1u);
}

TEST(ArtifactStore, ContentsSurviveReopen) {
  testing::TempDir dir;
  OpenStore(dir.Sub("db"))->Put("k1", "payload-1").IgnoreError();
  auto store = OpenStore(dir.Sub("db"));
  auto got = store->Get("k1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload-1");
  EXPECT_GT(store->Stats().bytes, 0u);
}

TEST(ArtifactStore, FlippedByteIsDataLossThenDeleted) {
  testing::TempDir dir;
  ASSERT_TRUE(OpenStore(dir.Sub("db"))->Put("k1", std::string(100, 'x')).ok());
  ASSERT_EQ(testing::EditRecords(dir.Sub("db"),
                                 [](const std::string&, std::string& v) { v[v.size() - 7] ^= 4; }),
            1);
  auto store = OpenStore(dir.Sub("db"));
  EXPECT_EQ(store->Get("k1").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->Get("k1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().corrupt, 1u);
  EXPECT_EQ(store->Stats().entries, 0u);
}

TEST(ArtifactStore, TruncatedValueIsDataLoss) {
  testing::TempDir dir;
  ASSERT_TRUE(OpenStore(dir.Sub("db"))->Put("k1", std::string(100, 'x')).ok());
  testing::EditRecords(dir.Sub("db"), [](const std::string&, std::string& v) { v.resize(60); });
  EXPECT_EQ(OpenStore(dir.Sub("db"))->Get("k1").status().code(), absl::StatusCode::kDataLoss);
}

TEST(ArtifactStore, EvictsLeastRecentlyUsedOverTheLimit) {
  testing::TempDir dir;
  const std::string value(1000, 'v');
  const uint64_t entry = 2 + kRecordHeaderSize + value.size();
  auto store = OpenStore(dir.Sub("db"), 3 * entry);
  ASSERT_TRUE(store->Put("k1", value).ok());
  ASSERT_TRUE(store->Put("k2", value).ok());
  ASSERT_TRUE(store->Put("k3", value).ok());
  ASSERT_TRUE(store->Get("k1").ok());  // k2 is now the least recently used
  ASSERT_TRUE(store->Put("k4", value).ok());
  EXPECT_TRUE(store->Get("k1").ok());
  EXPECT_EQ(store->Get("k2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->Get("k3").ok());
  EXPECT_TRUE(store->Get("k4").ok());
  EXPECT_EQ(store->Stats().evictions, 1u);
  EXPECT_LE(store->Stats().bytes, 3 * entry);
}

TEST(ArtifactStore, AccessOrderSurvivesReopen) {
  testing::TempDir dir;
  const std::string value(1000, 'v');
  const uint64_t entry = 2 + kRecordHeaderSize + value.size();
  {
    auto store = OpenStore(dir.Sub("db"), 3 * entry);
    ASSERT_TRUE(store->Put("k1", value).ok());
    ASSERT_TRUE(store->Put("k2", value).ok());
    ASSERT_TRUE(store->Get("k1").ok());
  }
  auto store = OpenStore(dir.Sub("db"), 2 * entry + 10);
  ASSERT_TRUE(store->Put("k3", value).ok());
  EXPECT_TRUE(store->Get("k1").ok());
  EXPECT_EQ(store->Get("k2").status().code(), absl::StatusCode::kNotFound);
}

TEST(ArtifactStore, ReplacingAKeyKeepsTheByteCountExact) {
  testing::TempDir dir;
  auto store = OpenStore(dir.Sub("db"));
  ASSERT_TRUE(store->Put("k", std::string(10, 'a')).ok());
  ASSERT_TRUE(store->Put("k", std::string(20, 'a')).ok());
  EXPECT_EQ(store->Stats().bytes, 1 + kRecordHeaderSize + 20);
  ASSERT_TRUE(store->Delete("k").ok());
  EXPECT_EQ(store->Stats().bytes, 0u);
}

}  // namespace
}  // namespace kiln::cache
