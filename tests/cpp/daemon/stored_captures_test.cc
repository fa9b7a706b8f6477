// Stored-capture records through kilnd's PutCaptures/GetCaptures: a signed record comes back as
// stored, survives a restart, reaches another daemon through the shared Redis tier, and one that
// is altered, moved to another key, signed with another key, malformed or oversized is refused;
// a record damaged in the store is dropped, and a frozen daemon stores nothing.
#include <gtest/gtest.h>

#include <string>

#include "cache/capture_records.h"
#include "cache/mac.h"
#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/test_daemon.h"

namespace kiln::daemon {
namespace {

using kiln::testing::TempDir;
using kiln::testing::TestDaemon;

const std::string kKey(64, 'a');
const std::string kOtherKey(64, 'b');

class StoredCaptures : public ::testing::Test {
 protected:
  std::unique_ptr<TestDaemon> StartDaemon(const std::string& name,
                                          const std::function<void(DaemonConfig&)>& more = {}) {
    return std::make_unique<TestDaemon>(dir_.Sub(name), compiler::TestCompilerOptions{},
                                        [&](DaemonConfig& c) {
                                          c.mac_key_file = dir_.Sub("cluster.key");
                                          if (more) more(c);
                                        });
  }
  // A record for `key` signed with the cluster's key (made by the first daemon started).
  std::string Signed(const std::string& key, const std::string& payload) {
    absl::StatusOr<cache::Mac> mac = cache::Mac::LoadOrCreate(dir_.Sub("cluster.key"));
    EXPECT_TRUE(mac.ok());
    return cache::CaptureRecords::Sign(*mac, key, payload);
  }
  static grpc::Status Put(TestDaemon& kilnd, const std::string& key, const std::string& record) {
    return kilnd.PutCaptures(key, record);
  }
  static kiln::v1::GetCapturesResponse Get(TestDaemon& kilnd, const std::string& key,
                                           grpc::StatusCode expect = grpc::StatusCode::OK) {
    kiln::v1::GetCapturesResponse response;
    EXPECT_EQ(kilnd.GetCaptures(key, &response).error_code(), expect);
    return response;
  }

  TempDir dir_;
};

TEST_F(StoredCaptures, ASignedRecordComesBackAsStoredAndSurvivesARestart) {
  auto kilnd = StartDaemon("a");
  EXPECT_FALSE(Get(*kilnd, kKey).found());
  const std::string record = Signed(kKey, R"({"key":"...","entries":[]})");
  ASSERT_TRUE(Put(*kilnd, kKey, record).ok());
  kiln::v1::GetCapturesResponse got = Get(*kilnd, kKey);
  ASSERT_TRUE(got.found());
  EXPECT_EQ(got.record(), record);
  EXPECT_FALSE(Get(*kilnd, kOtherKey).found());
  kiln::v1::StatsResponse stats = kilnd->Stats();
  EXPECT_EQ(stats.capture_records(), 1u);
  EXPECT_EQ(stats.capture_puts(), 1u);
  EXPECT_EQ(stats.capture_hits(), 1u);
  EXPECT_EQ(stats.entries(), 0u);  // apart from the artifacts
  kilnd->Restart();
  EXPECT_EQ(Get(*kilnd, kKey).record(), record);
}

TEST_F(StoredCaptures, RecordsThatDoNotVerifyAreRefused) {
  auto kilnd = StartDaemon("a");
  const std::string record = Signed(kKey, "payload");
  std::string altered = record;
  altered.back() ^= 1;
  EXPECT_EQ(Put(*kilnd, kKey, altered).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Signed for another key: not this one's.
  EXPECT_EQ(Put(*kilnd, kOtherKey, record).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Signed with another daemon's key.
  cache::Mac stranger(std::string(cache::Mac::kKeySize, 'x'));
  EXPECT_EQ(Put(*kilnd, kKey, cache::CaptureRecords::Sign(stranger, kKey, "payload")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Put(*kilnd, kKey, "no tag here").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Put(*kilnd, "not-a-key", record).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Put(*kilnd, kKey, Signed(kKey, std::string(cache::CaptureRecords::kMaxRecordBytes, 'p')))
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  Get(*kilnd, "NOT-HEX", grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(Get(*kilnd, kKey).found());
  EXPECT_EQ(kilnd->Stats().capture_rejected(), 6u);  // every Put refused
}

TEST_F(StoredCaptures, AFrozenDaemonServesRecordsButStoresNone) {
  auto kilnd = StartDaemon("a");
  const std::string record = Signed(kKey, "payload");
  ASSERT_TRUE(Put(*kilnd, kKey, record).ok());
  kilnd->Restart([](DaemonConfig& c) { c.frozen = true; });
  EXPECT_EQ(Put(*kilnd, kOtherKey, Signed(kOtherKey, "p")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Get(*kilnd, kKey).record(), record);
}

TEST_F(StoredCaptures, ARecordReachesAnotherDaemonThroughTheSharedTier) {
  if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
  kiln::testing::RedisServer redis(dir_.Sub(""));
  ASSERT_TRUE(redis.ok());
  auto shared = [&](DaemonConfig& c) {
    c.redis = redis.address();
    c.redis_timeout_ms = 10'000;
  };
  auto a = StartDaemon("a", shared);
  auto b = StartDaemon("b", shared);
  const std::string record = Signed(kKey, "payload");
  ASSERT_TRUE(Put(*a, kKey, record).ok());
  // The shared write is queued off the caller's thread: b finds it once it has landed.
  kiln::v1::GetCapturesResponse got;
  for (int i = 0; i < 200 && !got.found(); ++i) {
    got = Get(*b, kKey);
    if (!got.found()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(got.found());
  EXPECT_EQ(got.record(), record);
  kiln::v1::StatsResponse stats = b->Stats();
  EXPECT_EQ(stats.capture_records(), 1u);  // written through to b's own store
  EXPECT_EQ(stats.entries(), 0u);
}

}  // namespace
}  // namespace kiln::daemon
