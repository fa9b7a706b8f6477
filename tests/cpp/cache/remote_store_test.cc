// RedisStore against a real redis-server on a loopback port: round trip, namespacing,
// read-only mode, corrupt values, a server that is down, one that hangs (SIGSTOP) and comes
// back, AUTH, TLS and Unix sockets.
#include "cache/remote_store.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <vector>

#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<RedisStore> MakeStore(RedisStoreOptions options) {
  auto store = RedisStore::Create(std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
    redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.path());
    ASSERT_TRUE(redis_->ok()) << "redis-server did not start";
  }
  void TearDown() override {
    if (redis_) redis_->Signal(SIGCONT);
  }
  RedisStoreOptions Options(const std::string& ns = "kiln:v1:test") {
    RedisStoreOptions options;
    options.endpoint.port = redis_->port();
    options.key_namespace = ns;
    return options;
  }
  kiln::testing::TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(RemoteStoreTest, PutThenGetRoundTrips) {
  auto store = MakeStore(Options());
  ASSERT_TRUE(store->Put("k1", std::string("bytes\0more", 10)).ok());
  store->Flush();
  auto got = store->Get("k1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("bytes\0more", 10));
  EXPECT_EQ(store->Get("k2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().writes, 1u);
}

TEST_F(RemoteStoreTest, NamespacesByCompilerVersionDoNotMix) {
  auto v1 = MakeStore(Options("kiln:v1:compiler-a"));
  auto v2 = MakeStore(Options("kiln:v1:compiler-b"));
  ASSERT_TRUE(v1->Put("k", "a").ok());
  v1->Flush();
  EXPECT_EQ(v2->Get("k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteStoreTest, ReadOnlyNeverWrites) {
  RedisStoreOptions options = Options();
  options.read_only = true;
  auto store = MakeStore(options);
  EXPECT_EQ(store->Put("k", "a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeStore(Options())->Get("k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteStoreTest, CorruptValueIsDataLoss) {
  auto store = MakeStore(Options());
  redisContext* c = redis_->Connect();
  std::string key = store->RedisKey("k");
  freeReplyObject(redisCommand(c, "SET %b %s", key.data(), key.size(), "garbage"));
  redisFree(c);
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kDataLoss);
}

TEST(RemoteStoreDown, UnreachableServerIsUnavailableAndThenSkipped) {
  RedisStoreOptions options;
  options.endpoint.port = kiln::testing::FreeLoopbackPort();
  options.timeout = milliseconds(300);
  auto store = MakeStore(options);
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(store->Stats().down);
  auto start = Clock::now();
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(SecondsSince(start), 0.05);
  EXPECT_EQ(store->Stats().skipped, 1u);
}

TEST_F(RemoteStoreTest, ReconnectsAfterTheServerComesBack) {
  RedisStoreOptions options = Options();
  options.retry_after = milliseconds(50);
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Put("k", "v").ok());
  store->Flush();
  const int port = redis_->port();
  redis_.reset();  // server gone: a miss, not an error the caller must handle
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kUnavailable);
  redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.path(), port);
  ASSERT_TRUE(redis_->ok());
  // The background probe closes the circuit; no request pays for finding out.
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return !store->Stats().down; }));
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kNotFound);  // no persistence
  EXPECT_TRUE(store->Put("k", "v2").ok());
  store->Flush();
  EXPECT_EQ(*store->Get("k"), "v2");
}

TEST_F(RemoteStoreTest, HungServerCostsOneTimeoutThenIsSkippedUntilItAnswers) {
  RedisStoreOptions options = Options();
  options.timeout = milliseconds(300);
  options.retry_after = milliseconds(200);
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Put("k", "v").ok());
  store->Flush();
  ASSERT_TRUE(store->Get("k").ok());  // a pooled connection, as a busy daemon has

  redis_->Signal(SIGSTOP);  // accepts connections, answers nothing
  auto start = Clock::now();
  EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(SecondsSince(start), 0.6);
  start = Clock::now();
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(store->Get("k").status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(store->Put("k" + std::to_string(i), "v").code() != absl::StatusCode::kOk);
  }
  EXPECT_LT(SecondsSince(start), 0.05);  // skipped, not waited for
  EXPECT_TRUE(store->Stats().down);

  redis_->Signal(SIGCONT);
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return !store->Stats().down; }));
  EXPECT_EQ(*store->Get("k"), "v");
}

TEST_F(RemoteStoreTest, ConcurrentMissesOnAHungServerWaitOneTimeoutTogether) {
  RedisStoreOptions options = Options();
  options.timeout = milliseconds(300);
  auto store = MakeStore(options);
  redis_->Signal(SIGSTOP);
  const auto start = Clock::now();
  std::vector<std::future<absl::StatusCode>> misses;
  for (int i = 0; i < 6; ++i) {
    misses.push_back(std::async(std::launch::async, [&, i] {
      return store->Get("k" + std::to_string(i)).status().code();
    }));
  }
  for (auto& miss : misses) EXPECT_EQ(miss.get(), absl::StatusCode::kUnavailable);
  // One connection each, in parallel: ~0.3 s, where one shared connection took 6 timeouts.
  EXPECT_LT(SecondsSince(start), 0.9);
}

TEST_F(RemoteStoreTest, PutsDoNotWaitForAHungServer) {
  auto store = MakeStore(Options());
  redis_->Signal(SIGSTOP);
  const auto start = Clock::now();
  for (int i = 0; i < 20; ++i)
    store->Put("k" + std::to_string(i), std::string(1000, 'x')).IgnoreError();
  EXPECT_LT(SecondsSince(start), 0.05);
}

TEST(RemoteStoreAuth, PasswordAndAclUserAreSentAndAWrongPasswordFails) {
  if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
  kiln::testing::TempDir dir;
  kiln::testing::RedisServer redis(dir.path(), 0, {"--requirepass", "pw-default-0123"});
  ASSERT_TRUE(redis.ok());
  redisContext* c = redis.Connect();
  freeReplyObject(redisCommand(c, "AUTH pw-default-0123"));
  freeReplyObject(redisCommand(c, "ACL SETUSER kilnd on >pw-kilnd-0123 ~kiln:* +get +set +ping"));
  redisFree(c);

  RedisStoreOptions options;
  options.endpoint.port = redis.port();
  options.endpoint.password = "pw-default-0123";
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Put("k", "v").ok());
  store->Flush();
  EXPECT_EQ(*store->Get("k"), "v");

  options.endpoint.user = "kilnd";
  options.endpoint.password = "pw-kilnd-0123";
  EXPECT_EQ(*MakeStore(options)->Get("k"), "v");

  options.endpoint.password = "wrong";
  absl::Status refused = MakeStore(options)->Get("k").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("AUTH"), std::string::npos) << refused;
  options.endpoint.user.clear();
  options.endpoint.password.clear();
  EXPECT_EQ(MakeStore(options)->Get("k").status().code(), absl::StatusCode::kUnavailable);
}

TEST(RemoteStoreTls, VerifiesTheServerAgainstTheGivenCa) {
  if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
  kiln::testing::TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      dir.Sub("key.pem") + " -out " + dir.Sub("cert.pem") + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl could not make a test certificate";
  kiln::testing::RedisTlsFiles files{dir.Sub("cert.pem"), dir.Sub("key.pem")};
  kiln::testing::RedisServer redis(dir.path(), 0, {}, &files);
  if (!redis.ok()) GTEST_SKIP() << "this redis-server has no TLS";

  RedisStoreOptions options;
  options.endpoint.port = redis.tls_port();
  options.endpoint.tls = true;
  options.endpoint.tls_ca_file = dir.Sub("cert.pem");
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Put("k", "over tls").ok());
  store->Flush();
  EXPECT_EQ(*store->Get("k"), "over tls");

  options.endpoint.tls_server_name = "someone-else";
  EXPECT_EQ(MakeStore(options)->Get("k").status().code(), absl::StatusCode::kUnavailable);
  options.endpoint.tls_server_name.clear();
  options.endpoint.tls_ca_file.clear();  // the system's CAs do not know this certificate
  EXPECT_EQ(MakeStore(options)->Get("k").status().code(), absl::StatusCode::kUnavailable);
  options.endpoint.tls_ca_file = dir.Sub("missing.pem");
  EXPECT_EQ(RedisStore::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RemoteStoreUnix, ServesOverAUnixSocket) {
  if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
  kiln::testing::TempDir dir;
  kiln::testing::RedisServer redis(
      dir.path(), 0, {"--unixsocket", dir.Sub("redis.sock"), "--unixsocketperm", "700"});
  ASSERT_TRUE(redis.ok());
  RedisStoreOptions options;
  ASSERT_TRUE(ParseRedisAddress("unix:" + dir.Sub("redis.sock"), &options.endpoint).ok());
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Put("k", "v").ok());
  store->Flush();
  EXPECT_EQ(*store->Get("k"), "v");
}

TEST(RedisAddress, ParsesHostPortAndUnixAndRefusesTheRest) {
  RedisEndpoint endpoint;
  ASSERT_TRUE(ParseRedisAddress("cache.internal:6380", &endpoint).ok());
  EXPECT_EQ(endpoint.host, "cache.internal");
  EXPECT_EQ(endpoint.port, 6380);
  ASSERT_TRUE(ParseRedisAddress("[::1]:6379", &endpoint).ok());
  EXPECT_EQ(endpoint.host, "::1");
  for (const char* bad : {"localhost", ":6379", "host:0", "host:99999", "host:x"}) {
    EXPECT_FALSE(ParseRedisAddress(bad, &endpoint).ok()) << bad;
  }
}

}  // namespace
}  // namespace kiln::cache
