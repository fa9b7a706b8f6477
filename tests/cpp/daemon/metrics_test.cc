// kilnd's Prometheus endpoint, scraped over HTTP as Prometheus would: off unless asked, and
// each metric moving with the daemon's work (hits and misses by tier, compiles, refusals).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/capture_records.h"
#include "cache/mac.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/held_compiles.h"
#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/test_daemon.h"
#include "tests/cpp/support/wait_for.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;
using kiln::testing::TestDaemon;

struct HttpResponse {
  std::string status_line;
  std::string body;
};

// GET http://127.0.0.1:`port``path` over HTTP/1.0 (the server closes when it has answered).
HttpResponse HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  HttpResponse response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return response;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) raw.append(buffer, n);
  ::close(fd);
  size_t line_end = raw.find("\r\n");
  size_t head_end = raw.find("\r\n\r\n");
  if (line_end == std::string::npos || head_end == std::string::npos) return response;
  response.status_line = raw.substr(0, line_end);
  response.body = raw.substr(head_end + 4);
  return response;
}

// The value of `series` (name and labels exactly as exposed) in a text-format scrape.
std::optional<double> Sample(const std::string& scrape, const std::string& series) {
  std::istringstream lines(scrape);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::strtod(line.c_str() + series.size(), nullptr);
  }
  return std::nullopt;
}

// Expects each series (name and labels) to have its value in `scrape`.
void ExpectSamples(const std::string& scrape,
                   const std::vector<std::pair<std::string, double>>& expected) {
  for (const auto& [series, value] : expected) {
    EXPECT_EQ(Sample(scrape, series), value) << series;
  }
}

// A daemon serving metrics on a loopback port of the kernel's choice.
void WithMetrics(DaemonConfig& c) { c.metrics_listen = "127.0.0.1:0"; }

std::string Scrape(TestDaemon& kilnd) {
  HttpResponse response = HttpGet(kilnd.daemon().metrics_port(), "/metrics");
  EXPECT_NE(response.status_line.find(" 200 "), std::string::npos) << response.status_line;
  return response.body;
}

TEST(KilndMetrics, NoListenerUnlessAsked) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  EXPECT_EQ(kilnd.daemon().metrics_port(), 0);
  TestDaemon with(dir.Sub("with"), {}, WithMetrics);
  EXPECT_GT(with.daemon().metrics_port(), 0);
}

TEST(KilndMetrics, TheListenerStopsWithTheDaemonWithoutWaitingOutItsAcceptLoop) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, WithMetrics);
  const int port = kilnd.daemon().metrics_port();
  Scrape(kilnd);
  // civetweb's accept loop polls for 2 s between looks at its stop flag.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  kilnd.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  EXPECT_TRUE(HttpGet(port, "/metrics").status_line.empty());  // refused: nothing listens
}

TEST(KilndMetrics, AMissThenAHitMoveTheCacheAndCompileCounters) {
  TempDir dir;
  compiler::TestCompilerOptions slow;
  slow.delay = std::chrono::milliseconds(30);  // past the 25 ms bucket, whatever the load
  TestDaemon kilnd(dir.path(), slow, WithMetrics);
  ExpectSamples(Scrape(kilnd), {{"kiln_cache_hits_total{tier=\"local\"}", 0},
                                {"kiln_compiles_total", 0},
                                {"kiln_compile_duration_seconds_count", 0}});

  kiln::v1::CompileResponse first, second;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &first).ok());
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &second).ok());
  ASSERT_TRUE(second.cache_hit());
  const std::string after = Scrape(kilnd);
  ExpectSamples(after, {{"kiln_cache_hits_total{tier=\"local\"}", 1},
                        {"kiln_cache_misses_total{tier=\"local\"}", 1},
                        // No shared tier: never asked.
                        {"kiln_cache_hits_total{tier=\"shared\"}", 0},
                        {"kiln_cache_misses_total{tier=\"shared\"}", 0},
                        {"kiln_compiles_total", 1},
                        {"kiln_compile_errors_total", 0},
                        {"kiln_compile_duration_seconds_count", 1},
                        {"kiln_compile_duration_seconds_bucket{le=\"0.025\"}", 0},
                        {"kiln_compile_duration_seconds_bucket{le=\"300\"}", 1},
                        {"kiln_compile_duration_seconds_bucket{le=\"+Inf\"}", 1},
                        {"kiln_requests_total{rpc=\"Compile\"}", 2},
                        {"kiln_compile_queue_depth", 0},
                        {"kiln_compiles_in_flight", 0},
                        {"kiln_store_entries", 1}});
  EXPECT_GE(Sample(after, "kiln_compile_duration_seconds_sum").value_or(0), 0.03);
  // The same numbers the Stats RPC reports: both read one set of counters.
  const kiln::v1::StatsResponse stats = kilnd.Stats();
  EXPECT_EQ(Sample(after, "kiln_store_bytes"), static_cast<double>(stats.bytes_stored()));
  EXPECT_GT(stats.bytes_stored(), 0u);
  EXPECT_EQ(stats.hits(), 1u);
  EXPECT_EQ(stats.misses(), 1u);
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(Sample(Scrape(kilnd), "kiln_requests_total{rpc=\"Stats\"}"), 1);
}

TEST(KilndMetrics, EveryMetricHasHelpAndType) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, WithMetrics);
  const std::string scrape = Scrape(kilnd);
  for (const char* name :
       {"kiln_cache_hits_total", "kiln_cache_misses_total", "kiln_compiles_total",
        "kiln_compile_errors_total", "kiln_compile_duration_seconds", "kiln_compile_queue_depth",
        "kiln_compiles_in_flight", "kiln_compile_waiting_requests", "kiln_store_bytes",
        "kiln_store_entries", "kiln_store_evictions_total", "kiln_requests_total",
        "kiln_requests_refused_total", "kiln_shared_compile_waits_total",
        "kiln_shared_compile_wait_hits_total", "kiln_capture_records", "kiln_capture_hits_total",
        "kiln_capture_puts_total", "kiln_capture_rejected_total"}) {
    EXPECT_NE(scrape.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
    EXPECT_NE(scrape.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(scrape.find("# TYPE kiln_compile_duration_seconds histogram"), std::string::npos);
  EXPECT_NE(scrape.find("# TYPE kiln_compile_queue_depth gauge"), std::string::npos);
  EXPECT_NE(scrape.find("# TYPE kiln_requests_refused_total counter"), std::string::npos);
  EXPECT_NE(HttpGet(kilnd.daemon().metrics_port(), "/other").status_line.find(" 404 "),
            std::string::npos);
}

TEST(KilndMetrics, StoredCaptureRecordsAreCounted) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, WithMetrics);
  absl::StatusOr<cache::Mac> mac = cache::Mac::LoadOrCreate(kilnd.config().mac_key_file);
  ASSERT_TRUE(mac.ok());
  const std::string key(64, 'c');
  ASSERT_TRUE(kilnd.PutCaptures(key, cache::CaptureRecords::Sign(*mac, key, "payload")).ok());
  EXPECT_FALSE(
      kilnd.PutCaptures(key, cache::CaptureRecords::Sign(*mac, std::string(64, 'd'), "payload"))
          .ok());
  kiln::v1::GetCapturesResponse got;
  ASSERT_TRUE(kilnd.GetCaptures(key, &got).ok());
  ASSERT_TRUE(got.found());
  ExpectSamples(Scrape(kilnd), {{"kiln_capture_records", 1},
                                {"kiln_capture_puts_total", 1},
                                {"kiln_capture_hits_total", 1},
                                {"kiln_capture_rejected_total", 1},
                                {"kiln_requests_total{rpc=\"PutCaptures\"}", 2},
                                {"kiln_requests_total{rpc=\"GetCaptures\"}", 1},
                                {"kiln_store_entries", 0}});
}

TEST(KilndMetrics, AFailedCompileIsAnErrorAndStillTimed) {
  TempDir dir;
  compiler::TestCompilerOptions failing;
  failing.fail_op = "aten::relu";
  TestDaemon kilnd(dir.path(), failing, WithMetrics);
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(response.has_error());
  ExpectSamples(Scrape(kilnd), {{"kiln_compiles_total", 1},
                                {"kiln_compile_errors_total", 1},
                                {"kiln_compile_duration_seconds_count", 1},
                                {"kiln_store_entries", 0}});
}

TEST(KilndMetrics, RefusalsAreCountedByReason) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) {
    WithMetrics(c);
    c.frozen = true;
    c.max_request_bytes = 64 << 10;
  });
  kiln::v1::CompileResponse response;
  EXPECT_EQ(kilnd.Compile(MakeRequest(), &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  kiln::v1::CompileRequest oversized = MakeRequest();
  oversized.mutable_graph()->add_constants()->set_data(std::string(128 << 10, '\0'));
  EXPECT_EQ(kilnd.Compile(oversized, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto client = kilnd.NewClient();
  for (const std::string& key : {std::string("../not-a-key"), std::string()}) {
    kiln::v1::LookupRequest lookup;  // a malformed key, then neither a key nor a request
    if (!key.empty()) lookup.set_key(key);
    kiln::v1::LookupResponse found;
    grpc::ClientContext context;
    EXPECT_EQ(client->Lookup(&context, lookup, &found).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  ExpectSamples(Scrape(kilnd), {{"kiln_requests_refused_total{reason=\"frozen\"}", 1},
                                {"kiln_requests_refused_total{reason=\"too_large\"}", 1},
                                {"kiln_requests_refused_total{reason=\"invalid\"}", 2},
                                {"kiln_requests_refused_total{reason=\"queue_full\"}", 0},
                                {"kiln_requests_refused_total{reason=\"unauthenticated\"}", 0},
                                {"kiln_requests_total{rpc=\"Compile\"}", 2},
                                {"kiln_requests_total{rpc=\"Lookup\"}", 2}});
  EXPECT_EQ(kilnd.Stats().rejected(), 4u);
}

TEST(KilndMetrics, QueueDepthInFlightAndAFullQueueAreSeenWhileWorkWaits) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) {
    WithMetrics(c);
    kiln::testing::OneWorkerQueueOfOne(c);
  });
  kiln::testing::HeldCompiles held(kilnd);
  kiln::v1::CompileResponse refused;
  EXPECT_EQ(kilnd.Compile(MakeRequest(2), &refused).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectSamples(Scrape(kilnd), {{"kiln_compile_queue_depth", 1},
                                {"kiln_compiles_in_flight", 1},
                                {"kiln_compile_waiting_requests", 2},
                                {"kiln_requests_refused_total{reason=\"queue_full\"}", 1}});
  ASSERT_TRUE(held.Release());
  // A worker counts itself idle just after its compile has answered the callers.
  EXPECT_TRUE(kiln::testing::WaitFor(
      [&] { return Sample(Scrape(kilnd), "kiln_compiles_in_flight") == 0; }));
  ExpectSamples(Scrape(kilnd), {{"kiln_compile_queue_depth", 0},
                                {"kiln_compile_waiting_requests", 0},
                                {"kiln_compiles_total", 2}});
}

TEST(KilndMetrics, EvictionsAreCounted) {
  TempDir dir;
  // Every artifact is larger than the limit: each store evicts all but the one just written.
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) {
    WithMetrics(c);
    c.cache_max_bytes = 1;
  });
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(0), &response).ok());
  ASSERT_TRUE(kilnd.Compile(MakeRequest(1), &response).ok());
  ExpectSamples(Scrape(kilnd), {{"kiln_store_evictions_total", 1}, {"kiln_store_entries", 1}});
}

TEST(KilndMetrics, AHitFromTheSharedTierIsLabelledShared) {
  if (kiln::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server not installed";
  TempDir dir;
  kiln::testing::RedisServer redis(dir.Sub(""));
  ASSERT_TRUE(redis.ok());
  auto shared = [&](DaemonConfig& c) {
    WithMetrics(c);
    c.redis = redis.address();
    c.redis_timeout_ms = 10'000;  // a slow reply on a loaded machine must not become a miss
    c.mac_key_file = dir.Sub("cluster.key");
  };
  TestDaemon first(dir.Sub("a"), {}, shared);
  TestDaemon second(dir.Sub("b"), {}, shared);
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(first.Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(kiln::testing::WaitFor([&] { return first.Stats().remote_writes() == 1; }));
  ASSERT_TRUE(second.Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(response.cache_hit());
  ExpectSamples(Scrape(first), {{"kiln_cache_misses_total{tier=\"local\"}", 1},
                                {"kiln_cache_misses_total{tier=\"shared\"}", 1},
                                {"kiln_compiles_total", 1}});
  ExpectSamples(Scrape(second), {{"kiln_cache_hits_total{tier=\"shared\"}", 1},
                                 {"kiln_cache_misses_total{tier=\"local\"}", 1},
                                 {"kiln_cache_hits_total{tier=\"local\"}", 0},
                                 {"kiln_cache_misses_total{tier=\"shared\"}", 0},
                                 {"kiln_compiles_total", 0}});
}

TEST(KilndMetrics, AnAddressInUseFailsTheStartWithTheAddress) {
  TempDir dir;
  int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(busy, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  DaemonConfig config;
  config.cache_dir = dir.Sub("cache");
  config.socket_path = dir.Sub("run/kilnd.sock");
  config.metrics_listen = address;
  ASSERT_TRUE(FinishConfig(config).ok());
  compiler::TestCompiler compiler;
  Daemon kilnd(config, &compiler);
  absl::Status started = kilnd.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  EXPECT_NE(started.message().find(address), std::string::npos) << started;
  ::close(busy);
}

}  // namespace
}  // namespace kiln::daemon
