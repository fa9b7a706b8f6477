// Daemons sharing one real redis-server and their compile leases: a key asked of all at once is
// compiled once across them; a holder that died, failed or takes too long keeps the others
// waiting no longer than its lease, its failure, or the wait's bound; a long compile keeps its
// lease; a hung Redis costs a waiter one timeout; read-only daemons and --redis-lease-wait-ms 0
// take no lease.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include "cache/cache_key.h"
#include "cache/mac.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/test_daemon.h"
#include "tests/cpp/support/wait_for.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;
using kiln::testing::TestDaemon;
using kiln::testing::WaitFor;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class FleetLease : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
    redis_ = std::make_unique<kiln::testing::RedisServer>(dir_.Sub(""));
    ASSERT_TRUE(redis_->ok());
  }
  void TearDown() override {
    if (redis_) redis_->Signal(SIGCONT);
  }
  // A daemon with its own cache and socket under `name`, sharing Redis and the MAC key.
  std::unique_ptr<TestDaemon> StartDaemon(
      const std::string& name, compiler::TestCompilerOptions compiler = {},
      const std::function<void(DaemonConfig&)>& configure = nullptr) {
    return std::make_unique<TestDaemon>(dir_.Sub(name), std::move(compiler), [&](DaemonConfig& c) {
      c.redis = redis_->address();
      // About coordination, not time: a loaded machine must not turn a slow reply into a miss
      // (the hung-Redis tests set their own timeout).
      c.redis_timeout_ms = 10'000;
      c.mac_key_file = dir_.Sub("cluster.key");
      if (configure) configure(c);
    });
  }
  // Daemons "a" and "b", alike.
  std::pair<std::unique_ptr<TestDaemon>, std::unique_ptr<TestDaemon>> TwoDaemons(
      compiler::TestCompilerOptions compiler,
      const std::function<void(DaemonConfig&)>& configure = nullptr) {
    return {StartDaemon("a", compiler, configure), StartDaemon("b", compiler, configure)};
  }
  // The Redis key of the lease of `request`'s key, for a test that plays another daemon.
  std::string LeaseKeyOf(TestDaemon& kilnd, const kiln::v1::CompileRequest& request) {
    absl::StatusOr<cache::Mac> mac = cache::Mac::LoadOrCreate(dir_.Sub("cluster.key"));
    EXPECT_TRUE(mac.ok());
    const std::string key =
        cache::CacheKey(request, kilnd.compiler().VersionFor(request.target().device_kind()));
    return "kiln:v1:" + mac->Fingerprint() + ":lease:" + key;
  }
  void TakeLeaseByHand(const std::string& lease_key, int ttl_ms) {
    redisContext* c = redis_->Connect();
    auto* reply = static_cast<redisReply*>(redisCommand(
        c, "SET %s dead-kilnd NX PX %s", lease_key.c_str(), std::to_string(ttl_ms).c_str()));
    EXPECT_EQ(reply->type, REDIS_REPLY_STATUS);
    freeReplyObject(reply);
    redisFree(c);
  }
  int LeaseKeys() {
    redisContext* c = redis_->Connect();
    auto* reply = static_cast<redisReply*>(redisCommand(c, "KEYS *:lease:*"));
    int n = reply != nullptr && reply->type == REDIS_REPLY_ARRAY ? static_cast<int>(reply->elements)
                                                                 : -1;
    if (reply != nullptr) freeReplyObject(reply);
    redisFree(c);
    return n;
  }
  std::future<grpc::Status> CompileAsync(TestDaemon& kilnd, kiln::v1::CompileResponse* response,
                                         int variant = 0) {
    return std::async(std::launch::async, [&kilnd, response, variant] {
      return kilnd.Compile(MakeRequest(variant), response);
    });
  }
  // Starts MakeRequest() on `holder`, and returns once its compile is held at the compiler's
  // gate, the key's lease taken (releasing the compiler lets it finish).
  std::future<grpc::Status> HeldCompile(TestDaemon& holder, kiln::v1::CompileResponse* response) {
    holder.compiler().Hold();
    auto call = CompileAsync(holder, response);
    EXPECT_TRUE(WaitFor([&] { return holder.compiler().compiles() == 1; }));
    return call;
  }
  // Starts MakeRequest() on `waiter`, and returns once it waits for another daemon's compile.
  std::future<grpc::Status> WaitingCompile(TestDaemon& waiter,
                                           kiln::v1::CompileResponse* response) {
    auto call = CompileAsync(waiter, response);
    EXPECT_TRUE(WaitFor([&] { return waiter.Stats().shared_compile_waits() == 1; }));
    return call;
  }
  // Compiles MakeRequest() on `waiter`, whose lease another daemon holds, checks that the key
  // waited and then was compiled here, and returns how long that took.
  double SecondsToCompileAfterAWait(TestDaemon& waiter) {
    auto start = Clock::now();
    kiln::v1::CompileResponse response;
    EXPECT_TRUE(waiter.Compile(MakeRequest(), &response).ok());
    const double took = SecondsSince(start);
    EXPECT_FALSE(response.cache_hit());
    EXPECT_TRUE(response.has_artifact());
    EXPECT_EQ(waiter.compiler().compiles(), 1);
    EXPECT_EQ(waiter.Stats().shared_compile_waits(), 1u);
    EXPECT_EQ(waiter.Stats().shared_compile_wait_hits(), 0u);
    return took;
  }

  TempDir dir_;
  std::unique_ptr<kiln::testing::RedisServer> redis_;
};

TEST_F(FleetLease, TheSameKeyAskedOfThreeDaemonsAtOnceIsCompiledOnceAcrossThem) {
  compiler::TestCompilerOptions slow;
  slow.delay = milliseconds(500);
  std::vector<std::unique_ptr<TestDaemon>> fleet;
  for (const char* name : {"a", "b", "c"}) fleet.push_back(StartDaemon(name, slow));
  constexpr int kClientsEach = 3;
  kiln::v1::CompileResponse responses[3][kClientsEach];
  std::vector<std::future<grpc::Status>> calls;
  for (int d = 0; d < 3; ++d) {
    for (int i = 0; i < kClientsEach; ++i)
      calls.push_back(CompileAsync(*fleet[d], &responses[d][i]));
  }
  for (auto& call : calls) ASSERT_TRUE(call.get().ok());

  int compiles = 0, waits = 0, wait_hits = 0;
  for (auto& kilnd : fleet) {
    compiles += kilnd->compiler().compiles();
    const kiln::v1::StatsResponse stats = kilnd->Stats();
    EXPECT_LE(stats.shared_compile_waits(), 1u);  // one flight per daemon, however many clients
    waits += stats.shared_compile_waits();
    wait_hits += stats.shared_compile_wait_hits();
  }
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(waits, 2);
  EXPECT_EQ(wait_hits, 2);
  for (auto& per_daemon : responses) {
    for (auto& response : per_daemon) {
      EXPECT_EQ(response.artifact().SerializeAsString(),
                responses[0][0].artifact().SerializeAsString());
    }
  }
  EXPECT_TRUE(WaitFor([&] { return LeaseKeys() == 0; }));
}

TEST_F(FleetLease, AWaiterIsServedTheHoldersArtifactAsAHitWithoutAWorker) {
  auto a = StartDaemon("a");
  auto b = StartDaemon("b", {}, [](DaemonConfig& c) { c.workers = 1; });
  kiln::v1::CompileResponse on_a, on_b, other;
  auto held = HeldCompile(*a, &on_a);
  auto waiting = WaitingCompile(*b, &on_b);
  // b's only worker is free for other keys meanwhile.
  ASSERT_TRUE(b->Compile(MakeRequest(1), &other).ok());
  EXPECT_FALSE(other.cache_hit());
  a->compiler().Release();
  ASSERT_TRUE(held.get().ok());
  ASSERT_TRUE(waiting.get().ok());
  EXPECT_FALSE(on_a.cache_hit());
  EXPECT_TRUE(on_b.cache_hit());
  EXPECT_EQ(on_b.artifact().SerializeAsString(), on_a.artifact().SerializeAsString());
  EXPECT_EQ(b->compiler().compiles(), 1);  // the other key only
  EXPECT_EQ(b->Stats().shared_compile_wait_hits(), 1u);
  EXPECT_EQ(b->Stats().entries(), 2u);  // written through to b's local store
}

TEST_F(FleetLease, AHolderThatDiedKeepsTheKeyWaitingNoLongerThanItsLease) {
  auto b = StartDaemon("b");
  TakeLeaseByHand(LeaseKeyOf(*b, MakeRequest()), 1'500);  // and never renewed nor released
  const double took = SecondsToCompileAfterAWait(*b);
  EXPECT_GT(took, 1.2);
  EXPECT_LT(took, 4.0);
}

TEST_F(FleetLease, RenewalKeepsALongCompilesLeaseSoNoOtherDaemonCompilesIt) {
  auto [a, b] = TwoDaemons({}, [](DaemonConfig& c) { c.redis_lease_ttl_ms = 300; });
  kiln::v1::CompileResponse on_a, on_b;
  auto held = HeldCompile(*a, &on_a);
  auto waiting = WaitingCompile(*b, &on_b);
  std::this_thread::sleep_for(milliseconds(1'500));  // five times the lease's ttl
  EXPECT_EQ(LeaseKeys(), 1);
  EXPECT_EQ(b->compiler().compiles(), 0);
  a->compiler().Release();
  ASSERT_TRUE(held.get().ok());
  ASSERT_TRUE(waiting.get().ok());
  EXPECT_TRUE(on_b.cache_hit());
  EXPECT_EQ(b->compiler().compiles(), 0);
}

TEST_F(FleetLease, AWaitIsBoundedThenTheKeyIsCompiledHere) {
  auto b = StartDaemon("b", {}, [](DaemonConfig& c) { c.redis_lease_wait_ms = 500; });
  TakeLeaseByHand(LeaseKeyOf(*b, MakeRequest()), 60'000);  // a holder stuck for a minute
  const double took = SecondsToCompileAfterAWait(*b);
  EXPECT_GT(took, 0.4);
  EXPECT_LT(took, 3.0);
}

TEST_F(FleetLease, AFailedCompileReleasesItsLeaseSoTheOthersDoNotWaitOutItsTtl) {
  compiler::TestCompilerOptions failing;
  failing.fail_op = "aten::relu";
  auto [a, b] = TwoDaemons(failing);
  kiln::v1::CompileResponse on_a, on_b;
  auto held = HeldCompile(*a, &on_a);
  auto waiting = WaitingCompile(*b, &on_b);
  auto start = Clock::now();
  a->compiler().Release();
  ASSERT_TRUE(held.get().ok());
  ASSERT_TRUE(waiting.get().ok());
  EXPECT_LT(SecondsSince(start), 3.0);  // the lease's ttl is 10 s
  EXPECT_TRUE(on_a.has_error());
  EXPECT_TRUE(on_b.has_error());
  EXPECT_EQ(b->compiler().compiles(), 1);
  EXPECT_TRUE(WaitFor([&] { return LeaseKeys() == 0; }));
}

TEST_F(FleetLease, HungRedisWhileWaitingCostsOneTimeoutThenTheKeyIsCompiledHere) {
  auto [a, b] = TwoDaemons({}, [](DaemonConfig& c) { c.redis_timeout_ms = 300; });
  kiln::v1::CompileResponse on_a, on_b;
  auto held = HeldCompile(*a, &on_a);
  auto waiting = WaitingCompile(*b, &on_b);
  redis_->Signal(SIGSTOP);
  auto start = Clock::now();
  ASSERT_TRUE(waiting.get().ok());
  EXPECT_LT(SecondsSince(start), 1.5);
  EXPECT_FALSE(on_b.cache_hit());
  EXPECT_EQ(b->compiler().compiles(), 1);
  redis_->Signal(SIGCONT);
  a->compiler().Release();
  ASSERT_TRUE(held.get().ok());
  EXPECT_TRUE(on_a.has_artifact());
}

TEST_F(FleetLease, HungRedisFromTheStartLetsEveryDaemonCompileAtOnce) {
  auto [a, b] = TwoDaemons({}, [](DaemonConfig& c) { c.redis_timeout_ms = 300; });
  redis_->Signal(SIGSTOP);
  auto start = Clock::now();
  kiln::v1::CompileResponse on_a, on_b;
  auto first = CompileAsync(*a, &on_a);
  auto second = CompileAsync(*b, &on_b);
  ASSERT_TRUE(first.get().ok());
  ASSERT_TRUE(second.get().ok());
  EXPECT_LT(SecondsSince(start), 1.5);  // a lookup's timeout, then the circuit is open
  EXPECT_TRUE(on_a.has_artifact());
  EXPECT_TRUE(on_b.has_artifact());
  EXPECT_EQ(a->compiler().compiles() + b->compiler().compiles(), 2);
  EXPECT_EQ(a->Stats().shared_compile_waits() + b->Stats().shared_compile_waits(), 0u);
}

TEST_F(FleetLease, ReadOnlyDaemonsAndLeaseWaitZeroTakeNoLease) {
  auto reader = StartDaemon("r", {}, [](DaemonConfig& c) { c.redis_read_only = true; });
  auto solo = StartDaemon("s", {}, [](DaemonConfig& c) { c.redis_lease_wait_ms = 0; });
  for (TestDaemon* kilnd : {reader.get(), solo.get()}) {
    kiln::v1::CompileResponse response;
    auto held = HeldCompile(*kilnd, &response);
    EXPECT_EQ(LeaseKeys(), 0);
    kilnd->compiler().Release();
    ASSERT_TRUE(held.get().ok());
  }
  // Nor do they wait for another's: with the key's lease taken, they compile at once.
  TakeLeaseByHand(LeaseKeyOf(*solo, MakeRequest(1)), 60'000);
  kiln::v1::CompileResponse response;
  auto start = Clock::now();
  ASSERT_TRUE(reader->Compile(MakeRequest(1), &response).ok());
  ASSERT_TRUE(solo->Compile(MakeRequest(1), &response).ok());
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_EQ(reader->compiler().compiles(), 2);
  EXPECT_EQ(solo->compiler().compiles(), 2);
}

}  // namespace
}  // namespace kiln::daemon
