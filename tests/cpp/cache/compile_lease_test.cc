// CompileLeases against a real redis-server: one holder at a time, in the artifacts' namespace;
// release and renewal touch only the holder's own lease (with scripting and without); renewal
// outlives the ttl, a holder that stops renewing frees the key after it; a tier that is down or
// hung answers Unavailable within its timeout.
#include "cache/compile_lease.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

using std::chrono::milliseconds;

class CompileLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
    StartRedis({});
  }
  void TearDown() override {
    if (redis_) redis_->Signal(SIGCONT);
  }
  void StartRedis(std::vector<std::string> args) {
    redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.path(), 0, std::move(args));
    ASSERT_TRUE(redis_->ok()) << "redis-server did not start";
  }
  std::unique_ptr<RedisStore> Store() {
    RedisStoreOptions options;
    options.endpoint.port = redis_->port();
    options.key_namespace = "kiln:v1:test";
    options.timeout = milliseconds(300);
    auto store = RedisStore::Create(std::move(options));
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }
  // What Redis holds at `key` ("" when nothing), and its time to live in ms (-2: no key).
  std::string Value(const std::string& key) {
    redisContext* c = redis_->Connect();
    auto* reply = static_cast<redisReply*>(redisCommand(c, "GET %s", key.c_str()));
    std::string value =
        reply->type == REDIS_REPLY_STRING ? std::string(reply->str, reply->len) : "";
    freeReplyObject(reply);
    redisFree(c);
    return value;
  }
  long long Pttl(const std::string& key) {
    redisContext* c = redis_->Connect();
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PTTL %s", key.c_str()));
    long long ttl = reply->integer;
    freeReplyObject(reply);
    redisFree(c);
    return ttl;
  }
  void Redis(const std::string& command, const std::string& key) {
    redisContext* c = redis_->Connect();
    freeReplyObject(redisCommand(c, "%s %s", command.c_str(), key.c_str()));
    redisFree(c);
  }

  kiln::testing::TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(CompileLeaseTest, OneHolderAtATimeUnderTheArtifactsNamespace) {
  auto store_a = Store();
  auto store_b = Store();
  CompileLeases a(store_a.get(), {"daemon-a", milliseconds(10'000)});
  CompileLeases b(store_b.get(), {"daemon-b", milliseconds(10'000)});
  EXPECT_EQ(a.LeaseKey("k"), "kiln:v1:test:lease:k");
  ASSERT_EQ(*a.Acquire("k"), Lease::kOurs);
  EXPECT_EQ(*b.Acquire("k"), Lease::kTheirs);
  EXPECT_TRUE(*b.Held("k"));
  EXPECT_EQ(Value("kiln:v1:test:lease:k"), "daemon-a");
  EXPECT_GT(Pttl("kiln:v1:test:lease:k"), 9'000);
  EXPECT_EQ(a.held(), 1u);
  EXPECT_EQ(b.held(), 0u);
  a.Release("k");
  EXPECT_EQ(a.held(), 0u);
  EXPECT_FALSE(*b.Held("k"));
  EXPECT_EQ(*b.Acquire("k"), Lease::kOurs);
  EXPECT_EQ(*a.Acquire("k"), Lease::kTheirs);
}

TEST_F(CompileLeaseTest, ReleaseNeverFreesAnotherHoldersLease) {
  auto store = Store();
  CompileLeases a(store.get(), {"daemon-a", milliseconds(10'000)});
  CompileLeases b(store.get(), {"daemon-b", milliseconds(10'000)});
  ASSERT_EQ(*a.Acquire("k"), Lease::kOurs);
  Redis("DEL", "kiln:v1:test:lease:k");  // as if a's lease had expired
  ASSERT_EQ(*b.Acquire("k"), Lease::kOurs);
  a.Release("k");
  EXPECT_EQ(Value("kiln:v1:test:lease:k"), "daemon-b");
}

TEST_F(CompileLeaseTest, RenewalKeepsALeaseLongPastItsTtl) {
  auto store = Store();
  CompileLeases a(store.get(), {"daemon-a", milliseconds(300)});
  ASSERT_EQ(*a.Acquire("k"), Lease::kOurs);
  std::this_thread::sleep_for(milliseconds(1'200));
  EXPECT_TRUE(*a.Held("k"));
  EXPECT_GT(Pttl("kiln:v1:test:lease:k"), 0);
  a.Release("k");
  EXPECT_FALSE(*a.Held("k"));
}

TEST_F(CompileLeaseTest, AHolderThatStopsRenewingFreesTheKeyAfterItsTtl) {
  auto store = Store();
  auto dead = std::make_unique<CompileLeases>(store.get(),
                                              CompileLeaseOptions{"daemon-a", milliseconds(300)});
  ASSERT_EQ(*dead->Acquire("k"), Lease::kOurs);
  dead.reset();  // neither renewed nor released: a daemon that died
  CompileLeases b(store.get(), {"daemon-b", milliseconds(300)});
  EXPECT_EQ(*b.Acquire("k"), Lease::kTheirs);
  EXPECT_TRUE(kiln::testing::WaitFor([&] { return !*b.Held("k"); }, milliseconds(2'000)));
  EXPECT_EQ(*b.Acquire("k"), Lease::kOurs);
}

TEST_F(CompileLeaseTest, LostLeaseIsNoLongerRenewed) {
  auto store = Store();
  CompileLeases a(store.get(), {"daemon-a", milliseconds(300)});
  ASSERT_EQ(*a.Acquire("k"), Lease::kOurs);
  Redis("DEL", "kiln:v1:test:lease:k");  // expired while Redis was unreachable, say
  CompileLeases b(store.get(), {"daemon-b", milliseconds(10'000)});
  ASSERT_EQ(*b.Acquire("k"), Lease::kOurs);
  EXPECT_TRUE(kiln::testing::WaitFor([&] { return a.held() == 0; }, milliseconds(2'000)));
  EXPECT_EQ(Value("kiln:v1:test:lease:k"), "daemon-b");
  EXPECT_GT(Pttl("kiln:v1:test:lease:k"), 9'000);  // b's, not extended to a's ttl
}

TEST_F(CompileLeaseTest, WithoutScriptingRenewalAndReleaseStillTouchOnlyOurOwn) {
  StartRedis({"--rename-command", "EVAL", ""});
  auto store = Store();
  CompileLeases a(store.get(), {"daemon-a", milliseconds(300)});
  CompileLeases b(store.get(), {"daemon-b", milliseconds(10'000)});
  ASSERT_EQ(*a.Acquire("k"), Lease::kOurs);
  std::this_thread::sleep_for(milliseconds(900));
  EXPECT_TRUE(*a.Held("k"));  // renewed by PEXPIRE after a GET
  a.Release("k");
  EXPECT_FALSE(*a.Held("k"));
  ASSERT_EQ(*b.Acquire("k"), Lease::kOurs);
  a.Release("k");  // no longer a's: left alone
  EXPECT_EQ(Value("kiln:v1:test:lease:k"), "daemon-b");
}

TEST_F(CompileLeaseTest, HungTierIsUnavailableWithinItsTimeoutThenAtOnce) {
  auto store = Store();
  CompileLeases a(store.get(), {"daemon-a", milliseconds(10'000)});
  ASSERT_TRUE(a.Held("warm").ok());  // a pooled connection
  redis_->Signal(SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(a.Acquire("k").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a.Acquire("k").status().code(), absl::StatusCode::kUnavailable);  // circuit open
  EXPECT_EQ(a.Held("k").status().code(), absl::StatusCode::kUnavailable);
  a.Release("k");  // nothing to release, and no wait
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(700));
  EXPECT_EQ(a.held(), 0u);
}

}  // namespace
}  // namespace kiln::cache
