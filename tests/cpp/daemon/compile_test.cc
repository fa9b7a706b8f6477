// kilnd in-process with the TestCompiler: single-flight, integrity, MACs, validation, limits,
// deadlines, frozen mode and lookup.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <future>
#include <set>
#include <thread>

#include "cache/mac.h"
#include "cache/record.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/held_compiles.h"
#include "tests/cpp/support/redis_server.h"
#include "tests/cpp/support/tamper.h"
#include "tests/cpp/support/test_daemon.h"
#include "tests/cpp/support/wait_for.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;
using kiln::testing::TestDaemon;
using kiln::testing::WaitFor;
using std::chrono::milliseconds;

TEST(KilndCompile, ThirtyTwoConcurrentClientsForOneKeyCauseExactlyOneCompile) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kilnd.compiler().Hold();  // the one compile waits until every client is waiting on it
  std::vector<std::thread> clients;
  std::vector<grpc::Status> statuses(32);
  std::vector<kiln::v1::CompileResponse> responses(32);
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&, i] { statuses[i] = kilnd.Compile(MakeRequest(), &responses[i]); });
  }
  ASSERT_TRUE(WaitFor([&] { return kilnd.Stats().waiting() == 32; }));
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
  kilnd.compiler().Release();
  for (auto& t : clients) t.join();
  std::set<std::string> artifacts;
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    ASSERT_TRUE(responses[i].has_artifact());
    artifacts.insert(responses[i].artifact().SerializeAsString());
  }
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
  EXPECT_EQ(artifacts.size(), 1u);
  auto stats = kilnd.Stats();
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.misses(), 32u);
  EXPECT_EQ(stats.waiting(), 0u);
}

TEST(KilndCompile, SecondRequestIsServedFromTheCache) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileResponse first, second;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &first).ok());
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &second).ok());
  EXPECT_FALSE(first.cache_hit());
  EXPECT_TRUE(second.cache_hit());
  EXPECT_EQ(first.artifact().SerializeAsString(), second.artifact().SerializeAsString());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
  auto stats = kilnd.Stats();
  EXPECT_EQ(stats.hits(), 1u);
  EXPECT_EQ(stats.misses(), 1u);
  EXPECT_EQ(stats.entries(), 1u);
  EXPECT_GT(stats.bytes_stored(), 0u);
}

TEST(KilndCompile, FlippedByteInAStoredArtifactIsDetectedAndRecompiled) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileResponse original;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &original).ok());
  kilnd.Stop();
  ASSERT_EQ(kiln::testing::EditRecords(
                kilnd.config().cache_dir + "/artifacts",
                [](const std::string&, std::string& v) { v[v.size() / 2] ^= 0x10; }),
            1);
  kilnd.Start();
  kiln::v1::CompileResponse again;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &again).ok());
  EXPECT_FALSE(again.cache_hit());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);  // the fresh daemon's compiler compiled it again
  EXPECT_EQ(again.artifact().SerializeAsString(), original.artifact().SerializeAsString());
  EXPECT_EQ(kilnd.Stats().corrupt_records(), 1u);
  kiln::v1::CompileResponse third;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &third).ok());
  EXPECT_TRUE(third.cache_hit());
}

TEST(KilndCompile, ArtifactSignedWithAnotherKeyIsRejectedAndRecompiled) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileResponse original;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &original).ok());
  kilnd.Stop();
  // A well-framed record whose artifact an attacker re-signed with a key of their own.
  kiln::testing::EditRecords(
      kilnd.config().cache_dir + "/artifacts", [](const std::string&, std::string& v) {
        kiln::v1::Artifact artifact;
        artifact.ParseFromString(*cache::DecodeRecord(v));
        kiln::v1::ArtifactBody body;
        body.ParseFromString(artifact.body());
        body.set_kernel_binary("evil");
        v = cache::EncodeRecord(
            cache::SignArtifact(cache::Mac(std::string(32, 'x')), body).SerializeAsString());
      });
  kilnd.Start();
  kiln::v1::CompileResponse again;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &again).ok());
  EXPECT_FALSE(again.cache_hit());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
  EXPECT_EQ(again.artifact().SerializeAsString(), original.artifact().SerializeAsString());
}

TEST(KilndCompile, ClientHoldingTheWrongMacKeyRefusesTheArtifact) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  absl::StatusOr<cache::Mac> daemon_key = cache::Mac::LoadOrCreate(kilnd.config().mac_key_file);
  ASSERT_TRUE(daemon_key.ok());
  absl::StatusOr<kiln::v1::ArtifactBody> body = VerifyArtifact(*daemon_key, response.artifact());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->key(), response.key());
  EXPECT_EQ(body->compiler_version(), kilnd.compiler().Version());

  TempDir other;
  absl::StatusOr<cache::Mac> wrong_key = cache::Mac::LoadOrCreate(other.Sub("mac.key"));
  ASSERT_TRUE(wrong_key.ok());
  EXPECT_EQ(VerifyArtifact(*wrong_key, response.artifact()).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(KilndCompile, MalformedRequestsAreInvalidArgumentAndTheDaemonKeepsServing) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  std::vector<kiln::v1::CompileRequest> bad(5, MakeRequest());
  bad[0].mutable_graph()->mutable_nodes(0)->set_op("builtins::exec");
  bad[1].mutable_graph()->mutable_nodes(1)->mutable_args(0)->set_value(99);
  bad[2].clear_graph();
  bad[3].clear_target();
  bad[4].mutable_graph()->mutable_inputs(0)->mutable_meta()->clear_strides();
  for (const auto& request : bad) {
    kiln::v1::CompileResponse response;
    grpc::Status status = kilnd.Compile(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  kiln::v1::CompileResponse ok;
  EXPECT_TRUE(kilnd.Compile(MakeRequest(), &ok).ok());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
  EXPECT_EQ(kilnd.Stats().rejected(), bad.size());
}

TEST(KilndCompile, AnOpOffTheAllowlistCompilesWhenTheGraphDeclaresItFunctional) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileRequest request = MakeRequest();
  request.mutable_graph()->mutable_nodes(1)->set_op("aten::softshrink");
  kiln::v1::CompileResponse response;
  grpc::Status refused = kilnd.Compile(request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("declares no schema"), std::string::npos)
      << refused.error_message();
  kiln::v1::OpSchema* declared = request.mutable_graph()->add_schemas();
  declared->set_op("aten::softshrink");
  declared->set_schema("aten::softshrink(Tensor self, Scalar lambd=0.5) -> Tensor");
  grpc::Status admitted = kilnd.Compile(request, &response);
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
}

TEST(KilndCompile, OversizedRequestIsInvalidArgumentAndTheDaemonKeepsServing) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) { c.max_request_bytes = 64 << 10; });
  kiln::v1::CompileRequest request = MakeRequest();
  auto* constant = request.mutable_graph()->add_constants();
  constant->mutable_value()->set_id(10);
  kiln::testing::SetContiguous(constant->mutable_value()->mutable_meta(), {256, 128});
  constant->set_data(std::string(256 * 128 * 4, '\0'));  // 128 KiB
  kiln::v1::CompileResponse response;
  grpc::Status status = kilnd.Compile(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
}

TEST(KilndCompile, UndecodableBytesAreRefusedAndTheDaemonKeepsServing) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  auto channel =
      grpc::CreateChannel("unix:" + kilnd.config().socket_path, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::Slice garbage(std::string("\xff\xff\xff\xff\x0f garbage, not a protobuf"));
  grpc::ByteBuffer request(&garbage, 1), response;
  grpc::ClientContext context;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/kiln.v1.KilnService/Compile", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status status = done.get_future().get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("do not decode"), std::string::npos)
      << status.error_message();
  kiln::v1::CompileResponse ok;
  EXPECT_TRUE(kilnd.Compile(MakeRequest(), &ok).ok());
}

TEST(KilndCompile, CompileErrorComesBackStructured) {
  TempDir dir;
  compiler::TestCompilerOptions options;
  options.fail_op = "aten::relu";
  TestDaemon kilnd(dir.path(), options);
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  ASSERT_TRUE(response.has_error());
  EXPECT_EQ(response.error().code(), kiln::v1::CompileError::CODE_UNSUPPORTED_OP);
  ASSERT_TRUE(response.error().has_node_index());
  EXPECT_EQ(response.error().node_index(), 1);
  EXPECT_EQ(kilnd.Stats().compile_errors(), 1u);
}

TEST(KilndCompile, FrozenDaemonServesHitsAndRefusesToCompile) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(0), &response).ok());
  kilnd.Restart([](DaemonConfig& c) { c.frozen = true; });
  EXPECT_TRUE(kilnd.Compile(MakeRequest(0), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  EXPECT_EQ(kilnd.Compile(MakeRequest(1), &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(kilnd.compiler().compiles(), 0);
}

TEST(KilndCompile, LookupNeverCompiles) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  auto client = kilnd.NewClient();
  kiln::v1::LookupRequest by_request;
  *by_request.mutable_request() = MakeRequest();
  kiln::v1::LookupResponse miss;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(client->Lookup(&context, by_request, &miss).ok());
  }
  EXPECT_FALSE(miss.found());
  EXPECT_EQ(kilnd.compiler().compiles(), 0);

  kiln::v1::CompileResponse compiled;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &compiled).ok());
  EXPECT_EQ(compiled.key(), miss.key());
  kiln::v1::LookupRequest by_key;
  by_key.set_key(compiled.key());
  kiln::v1::LookupResponse hit;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(client->Lookup(&context, by_key, &hit).ok());
  }
  EXPECT_TRUE(hit.found());
  EXPECT_EQ(hit.artifact().SerializeAsString(), compiled.artifact().SerializeAsString());

  by_key.set_key("../../not-a-key");
  grpc::ClientContext context;
  EXPECT_EQ(client->Lookup(&context, by_key, &hit).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(KilndCompile, FullQueueAnswersResourceExhausted) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, kiln::testing::OneWorkerQueueOfOne);
  kiln::testing::HeldCompiles held(kilnd);
  kiln::v1::CompileResponse r2;
  EXPECT_EQ(kilnd.Compile(MakeRequest(2), &r2).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(held.Release());
  EXPECT_TRUE(kilnd.Compile(MakeRequest(2), &r2).ok());  // the daemon recovers once work drains
  EXPECT_EQ(kilnd.Stats().rejected(), 1u);
}

TEST(KilndCompile, ClientDeadlineIsHonouredAndTheCompileIsStillCached) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  kilnd.compiler().Hold();
  kiln::v1::CompileResponse response;
  EXPECT_EQ(kilnd.Compile(MakeRequest(), &response, milliseconds(100)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(kilnd.Stats().entries(), 0u);
  kilnd.compiler().Release();
  ASSERT_TRUE(WaitFor([&] { return kilnd.Stats().entries() == 1; }));
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  EXPECT_EQ(kilnd.compiler().compiles(), 1);
}

TEST(KilndCompile, ByteLimitEvictsLeastRecentlyUsedArtifacts) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) { c.cache_max_bytes = 1; });
  kiln::v1::CompileResponse response;
  for (int variant = 0; variant < 3; ++variant) {
    ASSERT_TRUE(kilnd.Compile(MakeRequest(variant), &response).ok());
  }
  auto stats = kilnd.Stats();
  EXPECT_EQ(stats.entries(), 1u);  // only the newest is kept under a 1-byte limit
  EXPECT_EQ(stats.evictions(), 2u);
  ASSERT_TRUE(kilnd.Compile(MakeRequest(2), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  ASSERT_TRUE(kilnd.Compile(MakeRequest(0), &response).ok());
  EXPECT_FALSE(response.cache_hit());
}

TEST(KilndCompile, UnreachableSharedTierDegradesToLocalCompiles) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) {
    c.redis = "127.0.0.1:" + std::to_string(kiln::testing::FreeLoopbackPort());
  });
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  EXPECT_TRUE(response.has_artifact());
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  EXPECT_TRUE(response.cache_hit());
}

TEST(KilndCompile, TheShippedPlaceholderCompilerAnswersUnimplemented) {
  TempDir dir;
  DaemonConfig config;
  config.cache_dir = dir.Sub("cache");
  config.socket_path = dir.Sub("run/kilnd.sock");
  ASSERT_TRUE(FinishConfig(config).ok());
  compiler::UnimplementedCompiler compiler;
  Daemon kilnd(config, &compiler);
  ASSERT_TRUE(kilnd.Start().ok());
  auto client = kiln::v1::KilnService::NewStub(
      grpc::CreateChannel("unix:" + config.socket_path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(client->Compile(&context, MakeRequest(), &response).ok());
  ASSERT_TRUE(response.has_error());
  EXPECT_EQ(response.error().code(), kiln::v1::CompileError::CODE_UNIMPLEMENTED);
  EXPECT_FALSE(response.error().has_node_index());
  kilnd.RequestShutdown();
  kilnd.Wait();
}

TEST(KilndLifecycle, HealthReportsIdentity) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) { c.frozen = true; });
  grpc::ClientContext context;
  kiln::v1::HealthResponse health;
  ASSERT_TRUE(kilnd.NewClient()->Health(&context, kiln::v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.state(), kiln::v1::HealthResponse::STATE_SERVING);
  EXPECT_EQ(health.compiler_version(), kilnd.compiler().Version());
  EXPECT_EQ(health.pid(), ::getpid());
  EXPECT_TRUE(health.frozen());
}

TEST(KilndLifecycle, SocketIsPrivateAndASecondDaemonIsRefused) {
  TempDir dir;
  TestDaemon kilnd(dir.path());
  struct stat st {};
  ASSERT_EQ(::stat(kilnd.config().socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
  ASSERT_EQ(::stat(dir.Sub("run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700);

  compiler::TestCompiler compiler;
  DaemonConfig second = kilnd.config();
  second.cache_dir = dir.Sub("cache2");
  Daemon other(second, &compiler);
  EXPECT_EQ(other.Start().code(), absl::StatusCode::kAlreadyExists);
  kiln::v1::CompileResponse response;
  EXPECT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
}

TEST(KilndLifecycle, ShutdownRpcDrainsAndIdleExitStopsAnIdleDaemon) {
  TempDir dir;
  TestDaemon kilnd(dir.path(), {}, [](DaemonConfig& c) { c.idle_exit_seconds = 1; });
  auto start = std::chrono::steady_clock::now();
  kilnd.daemon().Wait();  // returns by itself once idle for a second
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(::access(kilnd.config().socket_path.c_str(), F_OK), 0);

  kilnd.Restart([](DaemonConfig& c) { c.idle_exit_seconds = 0; });
  grpc::ClientContext context;
  kiln::v1::ShutdownResponse response;
  ASSERT_TRUE(kilnd.NewClient()->Shutdown(&context, kiln::v1::ShutdownRequest(), &response).ok());
  EXPECT_TRUE(response.accepted());
  kilnd.daemon().Wait();
}

}  // namespace
}  // namespace kiln::daemon
