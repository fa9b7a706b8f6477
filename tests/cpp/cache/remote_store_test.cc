// RedisStore against a real redis-server on a loopback port: round trip, namespacing,
// read-only mode, corrupt values, and a server that is down.
#include "cache/remote_store.h"

#include <gtest/gtest.h>

#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
    redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.path());
    ASSERT_TRUE(redis_->ok()) << "redis-server did not start";
  }
  RedisStoreOptions Options(const std::string& ns = "kiln:v1:test") {
    RedisStoreOptions options;
    options.port = redis_->port();
    options.key_namespace = ns;
    return options;
  }
  kiln::testing::TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(RemoteStoreTest, PutThenGetRoundTrips) {
  RedisStore store(Options());
  ASSERT_TRUE(store.Put("k1", std::string("bytes\0more", 10)).ok());
  auto got = store.Get("k1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("bytes\0more", 10));
  EXPECT_EQ(store.Get("k2").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteStoreTest, NamespacesByCompilerVersionDoNotMix) {
  RedisStore v1(Options("kiln:v1:compiler-a"));
  RedisStore v2(Options("kiln:v1:compiler-b"));
  ASSERT_TRUE(v1.Put("k", "a").ok());
  EXPECT_EQ(v2.Get("k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteStoreTest, ReadOnlyNeverWrites) {
  RedisStoreOptions options = Options();
  options.read_only = true;
  RedisStore store(options);
  EXPECT_EQ(store.Put("k", "a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RedisStore(Options()).Get("k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteStoreTest, CorruptValueIsDataLoss) {
  RedisStore store(Options());
  redisContext* c = redis_->Connect();
  std::string key = store.RedisKey("k");
  freeReplyObject(redisCommand(c, "SET %b %s", key.data(), key.size(), "garbage"));
  redisFree(c);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kDataLoss);
}

TEST(RemoteStoreDown, UnreachableServerIsUnavailable) {
  RedisStoreOptions options;
  options.port = kiln::testing::FreeLoopbackPort();
  options.timeout = std::chrono::milliseconds(300);
  RedisStore store(options);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.Put("k", "v").code(), absl::StatusCode::kUnavailable);
}

TEST_F(RemoteStoreTest, ReconnectsAfterTheServerComesBack) {
  RedisStoreOptions options = Options();
  options.retry_after = std::chrono::milliseconds(0);
  RedisStore store(options);
  ASSERT_TRUE(store.Put("k", "v").ok());
  const int port = redis_->port();
  redis_.reset();  // server gone: a miss, not an error the caller must handle
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kUnavailable);
  redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.path(), port);
  ASSERT_TRUE(redis_->ok());
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kNotFound);  // no persistence
  EXPECT_TRUE(store.Put("k", "v2").ok());
  EXPECT_EQ(*store.Get("k"), "v2");
}

}  // namespace
}  // namespace kiln::cache
