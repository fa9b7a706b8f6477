// Two kilnd sharing one real redis-server: the second serves the first one's compile without
// compiling; read-only daemons never write; a daemon with another MAC key does not trust it.
#include <gtest/gtest.h>

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
          c.redis_read_only = read_only;
          c.mac_key_file = key_file.empty() ? dir_.Sub("cluster.key") : key_file;
        });
  }
  TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(SharedTier, SecondDaemonServesTheFirstOnesCompileWithoutCompiling) {
  auto first = StartDaemon("a");
  auto second = StartDaemon("b");
  kiln::v1::CompileResponse compiled, served;
  ASSERT_TRUE(first->Compile(MakeRequest(), &compiled).ok());
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
  ASSERT_TRUE(reader->Compile(MakeRequest(0), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  ASSERT_TRUE(reader->Compile(MakeRequest(1), &response).ok());  // compiled locally only
  EXPECT_EQ(reader->compiler().compiles(), 1);
  cache::RedisStoreOptions options;
  options.port = redis_->port();
  options.key_namespace = "kiln:v1:" + reader->compiler().Version();
  EXPECT_EQ(cache::RedisStore(options).Get(response.key()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SharedTier, DaemonWithAnotherKeyDoesNotTrustTheSharedArtifact) {
  auto first = StartDaemon("a");
  auto stranger = StartDaemon("s", false, dir_.Sub("stranger.key"));
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(first->Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(stranger->Compile(MakeRequest(), &response).ok());
  EXPECT_FALSE(response.cache_hit());
  EXPECT_EQ(stranger->compiler().compiles(), 1);
}

}  // namespace
}  // namespace kiln::daemon
