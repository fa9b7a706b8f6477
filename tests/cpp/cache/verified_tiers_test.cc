// VerifiedTiers over a real local ArtifactStore and an in-memory shared tier that can be made
// slow: concurrent reads of one key make one shared read, and what its waiters are served.
#include "cache/verified_tiers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/cpp/support/artifact_store_for_tests.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

using kiln::testing::OpenStore;

// A shared tier in memory whose Get takes `delay`, counting the reads it answers.
class SlowSharedTier : public RemoteStore {
 public:
  explicit SlowSharedTier(std::chrono::milliseconds delay) : delay_(delay) {}

  absl::StatusOr<std::string> Get(std::string_view key) override {
    ++gets;
    std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return absl::NotFoundError("absent");
    return it->second;
  }
  absl::Status Put(std::string_view key, std::string_view payload) override {
    return PutNow(key, payload);
  }
  absl::Status PutNow(std::string_view key, std::string_view payload) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[std::string(key)] = std::string(payload);
    return absl::OkStatus();
  }
  bool read_only() const override { return false; }
  RemoteStoreStats Stats() const override { return {}; }

  std::atomic<int> gets{0};

 private:
  std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::map<std::string, std::string> values_;
};

// Runs `n` GetShared calls for `key` at once; each accepts only `expect` and records what it
// saw. Returns their results.
std::vector<absl::StatusOr<CacheTier>> ReadAtOnce(VerifiedTiers& tiers, const std::string& key,
                                                  const std::string& expect, int n,
                                                  std::atomic<int>* served_values) {
  std::vector<absl::StatusOr<CacheTier>> results(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = tiers.GetShared(key, [&](std::string_view value) {
        if (value != expect) return absl::DataLossError("not the value stored");
        ++*served_values;
        return absl::OkStatus();
      });
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// A local store in a temporary directory and a shared tier whose reads take 200 ms.
class VerifiedTiersTest : public ::testing::Test {
 protected:
  testing::TempDir dir;
  std::unique_ptr<ArtifactStore> local = OpenStore(dir.Sub("db"));
  SlowSharedTier shared{std::chrono::milliseconds(200)};
  VerifiedTiers tiers{local.get(), &shared, "value", "p:"};
};

TEST_F(VerifiedTiersTest, ConcurrentReadsOfOneKeyMakeOneSharedReadAndAllAreServed) {
  ASSERT_TRUE(shared.PutNow("p:key", "the value").ok());

  std::atomic<int> served{0};
  auto results = ReadAtOnce(tiers, "key", "the value", 8, &served);
  int remote = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    remote += *r == CacheTier::kRemote;
  }
  EXPECT_EQ(shared.gets.load(), 1);
  EXPECT_EQ(tiers.shared_reads(), 1u);
  EXPECT_EQ(remote, 1);  // the one that read; the others were served from the local store
  EXPECT_EQ(served.load(), 8);
  // Written through: a later local read finds it without the shared tier.
  EXPECT_TRUE(tiers.GetLocal("key", [](std::string_view) { return absl::OkStatus(); }).ok());
}

TEST_F(VerifiedTiersTest, ConcurrentMissesOfOneKeyMakeOneSharedReadAndAllMiss) {
  std::atomic<int> served{0};
  for (const auto& r : ReadAtOnce(tiers, "absent", "x", 6, &served)) {
    EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  }
  EXPECT_EQ(shared.gets.load(), 1);
  EXPECT_EQ(served.load(), 0);
  // The read is over: the next caller asks the shared tier again (the value may be there now).
  ASSERT_TRUE(shared.PutNow("p:absent", "x").ok());
  EXPECT_TRUE(ReadAtOnce(tiers, "absent", "x", 1, &served)[0].ok());
  EXPECT_EQ(shared.gets.load(), 2);
}

TEST_F(VerifiedTiersTest, ARefusedSharedValueIsAMissForEveryWaiterAndIsNotStored) {
  ASSERT_TRUE(shared.PutNow("p:key", "forged").ok());

  std::atomic<int> served{0};
  for (const auto& r : ReadAtOnce(tiers, "key", "genuine", 5, &served)) {
    EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  }
  EXPECT_EQ(served.load(), 0);
  EXPECT_EQ(tiers.rejected(), 1u);
  EXPECT_TRUE(absl::IsNotFound(local->Get("key").status()));
}

TEST_F(VerifiedTiersTest, ReadsOfDifferentKeysDoNotWaitForEachOther) {
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      tiers.GetShared("k" + std::to_string(i), [](std::string_view) { return absl::OkStatus(); })
          .IgnoreError();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(shared.gets.load(), 4);
  // Four reads of 200 ms each, at once rather than one after another.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(700));
}

}  // namespace
}  // namespace kiln::cache
