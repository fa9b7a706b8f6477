// Two kilnd sharing one real redis-server: the second serves the first one's compile without
// compiling; read-only daemons never write; a daemon with another MAC key does not trust it.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string_view>

#include "cache/remote_store.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/test_daemon.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;
using kiln::testing::TestDaemon;

class SharedTier : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
    redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.Sub(""));
    ASSERT_TRUE(redis_->ok());
  }
  // A daemon with its own cache and socket under `name`, sharing Redis and (by default) the key.
  std::unique_ptr<TestDaemon> StartDaemon(const std::string& name, bool read_only = false,
                                          const std::string& key_file = "") {
    return std::make_unique<TestDaemon>(
        dir_.Sub(name), compiler::TestCompilerOptions{}, [&](DaemonConfig& c) {
          c.redis = redis_->address();
          // These tests are about what is shared, not about time: a loaded machine must not
          // turn a slow Redis reply into a miss (the hung-Redis test sets its own timeout).
          c.redis_timeout_ms = 10'000;
          c.redis_read_only = read_only;
          c.mac_key_file = key_file.empty() ? dir_.Sub("cluster.key") : key_file;
        });
  }
  // Whether a Redis key is a compile lease ("<namespace>lease:<cache key>"): held while a
  // daemon compiles, it ends with the cache key too but holds no artifact.
  static bool IsLease(const redisReply* key) {
    return std::string_view(key->str, key->len).find("lease:") != std::string_view::npos;
  }
  // How many Redis keys end with `suffix` (a cache key, whatever the namespace), leases aside.
  int RedisKeysEndingWith(const std::string& suffix) {
    redisContext* c = redis_->Connect();
    auto* reply = static_cast<redisReply*>(redisCommand(c, "KEYS %s", ("*" + suffix).c_str()));
    int n = -1;
    if (reply != nullptr && reply->type == REDIS_REPLY_ARRAY) {
      n = 0;
      for (size_t i = 0; i < reply->elements; ++i) n += IsLease(reply->element[i]) ? 0 : 1;
    }
    if (reply != nullptr) freeReplyObject(reply);
    redisFree(c);
    return n;
  }
  // The value of every Redis key ending with `suffix`, leases aside, concatenated.
  std::string RedisValuesOf(const std::string& suffix) {
    redisContext* c = redis_->Connect();
    auto* keys = static_cast<redisReply*>(redisCommand(c, "KEYS %s", ("*" + suffix).c_str()));
    std::string out;
    for (size_t i = 0; keys != nullptr && i < keys->elements; ++i) {
      if (IsLease(keys->element[i])) continue;
      auto* value = static_cast<redisReply*>(
          redisCommand(c, "GET %b", keys->element[i]->str, keys->element[i]->len));
      out += std::string(value->str, value->len) + "|";
      freeReplyObject(value);
    }
    if (keys != nullptr) freeReplyObject(keys);
    redisFree(c);
    return out;
  }
  TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(SharedTier, SecondDaemonServesTheFirstOnesCompileWithoutCompiling) {
  auto first = StartDaemon("a");
  auto second = StartDaemon("b");
  kiln::v1::CompileResponse compiled, served;
  ASSERT_TRUE(first->Compile(MakeRequest(), &compiled).ok());
  // The artifact reaches Redis off the compile's thread: wait for it before the second asks.
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return RedisKeysEndingWith(compiled.key()) == 1; }));
  ASSERT_TRUE(second->Compile(MakeRequest(), &served).ok());
  EXPECT_EQ(first->compiler().compiles(), 1);
  EXPECT_EQ(second->compiler().compiles(), 0);
  EXPECT_TRUE(served.cache_hit());
  EXPECT_EQ(served.artifact().SerializeAsString(), compiled.artifact().SerializeAsString());
  EXPECT_EQ(second->Stats().remote_hits(), 1u);
  // Read through: the second daemon now holds it locally too.
  EXPECT_EQ(second->Stats().entries(), 1u);
}

TEST_F(SharedTier, ReadOnlyDaemonReadsButNeverWrites) {
  auto writer = StartDaemon("w");
  auto reader = StartDaemon("r", /*read_only=*/true);
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(writer->Compile(MakeRequest(0), &response).ok());
  // The writer's artifact reaches Redis off the compile's thread: wait for it.
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return RedisKeysEndingWith(response.key()) == 1; }));
  ASSERT_TRUE(reader->Compile(MakeRequest(0), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  ASSERT_TRUE(reader->Compile(MakeRequest(1), &response).ok());  // compiled locally only
  EXPECT_EQ(reader->compiler().compiles(), 1);
  EXPECT_EQ(RedisKeysEndingWith(response.key()), 0);
}

TEST_F(SharedTier, DaemonWithAnotherKeyNeitherTrustsNorOverwritesTheSharedArtifact) {
  auto first = StartDaemon("a");
  auto stranger = StartDaemon("s", false, dir_.Sub("stranger.key"));
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(first->Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return RedisKeysEndingWith(response.key()) == 1; }));
  const std::string shared = RedisValuesOf(response.key());
  ASSERT_TRUE(stranger->Compile(MakeRequest(), &response).ok());
  EXPECT_FALSE(response.cache_hit());
  EXPECT_EQ(stranger->compiler().compiles(), 1);
  // The stranger's artifact went to its own namespace: the cluster's entry is untouched.
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return RedisKeysEndingWith(response.key()) == 2; }));
  EXPECT_NE(RedisValuesOf(response.key()).find(shared), std::string::npos);
}

TEST_F(SharedTier, HungRedisCostsAMissOneTimeoutAtMostAndCompilesGoOn) {
  auto daemon = std::make_unique<TestDaemon>(dir_.Sub("h"), compiler::TestCompilerOptions{},
                                             [&](DaemonConfig& c) {
                                               c.redis = redis_->address();
                                               c.redis_timeout_ms = 300;
                                             });
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(daemon->Compile(MakeRequest(0), &response).ok());  // connections pooled
  redis_->Signal(SIGSTOP);
  std::vector<double> seconds;
  for (int variant = 1; variant <= 6; ++variant) {
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(daemon->Compile(MakeRequest(variant), &response).ok());
    EXPECT_TRUE(response.has_artifact());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  redis_->Signal(SIGCONT);
  EXPECT_LT(seconds[0], 0.6);  // the miss that found Redis hung
  for (size_t i = 1; i < seconds.size(); ++i) EXPECT_LT(seconds[i], 0.1) << i;  // skipped
  EXPECT_TRUE(daemon->Stats().remote_down());
  EXPECT_GE(daemon->Stats().remote_skipped(), 5u);
}

}  // namespace
}  // namespace kiln::daemon
