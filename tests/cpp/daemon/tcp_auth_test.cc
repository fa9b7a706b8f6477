// The TCP listener: refused without TLS or a token; with them, every call needs the bearer token.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "daemon/config.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/test_daemon.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;
using kiln::testing::TestDaemon;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(KilndTcp, RefusesTcpWithoutTlsOrWithoutToken) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--listen", "tcp://127.0.0.1:0"},
           {"--listen", "tcp://127.0.0.1:0", "--token-file", "/tmp/t"},
           {"--listen", "tcp://127.0.0.1:0", "--tls-cert", "c.pem", "--tls-key", "k.pem"}}) {
    auto parsed = ParseCommandLine(args);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
  auto ok = ParseCommandLine({"--listen", "tcp://127.0.0.1:0", "--tls-cert", "c.pem", "--tls-key",
                              "k.pem", "--token-file", "t"});
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(KilndTcp, DaemonRefusesToStartTcpWithoutTlsOrToken) {
  TempDir dir;
  compiler::TestCompiler compiler;
  for (int missing = 0; missing < 3; ++missing) {
    DaemonConfig config;
    config.cache_dir = dir.Sub("cache");
    config.socket_path = dir.Sub("run/kilnd.sock");
    config.listen_tcp = "127.0.0.1:0";
    config.tls_cert = missing == 0 ? "" : dir.Sub("cert.pem");
    config.tls_key = missing == 1 ? "" : dir.Sub("key.pem");
    config.token_file = missing == 2 ? "" : dir.Sub("token");
    Daemon daemon(config, &compiler);
    EXPECT_EQ(daemon.Start().code(), absl::StatusCode::kInvalidArgument);
  }
}

class KilndTls : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string cmd =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-days 1 -subj /CN=localhost -addext subjectAltName=DNS:localhost "
        "-keyout " +
        dir_.Sub("key.pem") + " -out " + dir_.Sub("cert.pem") + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl could not make a test certificate";
    std::ofstream(dir_.Sub("token")) << kToken << "\n";
    kilnd_ = std::make_unique<TestDaemon>(dir_.path(), compiler::TestCompilerOptions{},
                                          [this](DaemonConfig& c) {
                                            c.listen_tcp = "127.0.0.1:0";
                                            c.tls_cert = dir_.Sub("cert.pem");
                                            c.tls_key = dir_.Sub("key.pem");
                                            c.token_file = dir_.Sub("token");
                                          });
    ASSERT_GT(kilnd_->daemon().tcp_port(), 0);
  }

  std::unique_ptr<kiln::v1::KilnService::Stub> TlsClient() {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(dir_.Sub("cert.pem"));
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return kiln::v1::KilnService::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(kilnd_->daemon().tcp_port()),
                                  grpc::SslCredentials(ssl), args));
  }

  grpc::Status CompileWith(kiln::v1::KilnService::Stub* stub, const std::string& authorization) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
    kiln::v1::CompileResponse response;
    return stub->Compile(&context, MakeRequest(), &response);
  }

  TempDir dir_;
  std::unique_ptr<TestDaemon> kilnd_;
};

TEST_F(KilndTls, CallWithoutTokenIsUnauthenticated) {
  auto client = TlsClient();
  EXPECT_EQ(CompileWith(client.get(), "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CompileWith(client.get(), "Bearer wrong-token-0123456789abcd").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CompileWith(client.get(), kToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext context;
  kiln::v1::StatsResponse stats;
  EXPECT_EQ(client->Stats(&context, kiln::v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(kilnd_->compiler().compiles(), 0);
}

TEST_F(KilndTls, CallWithTokenOverTlsIsServed) {
  auto client = TlsClient();
  grpc::Status status = CompileWith(client.get(), std::string("Bearer ") + kToken);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(kilnd_->compiler().compiles(), 1);
}

TEST_F(KilndTls, PlaintextClientCannotTalkToTheTlsPort) {
  auto client = kiln::v1::KilnService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(kilnd_->daemon().tcp_port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  kiln::v1::CompileResponse response;
  EXPECT_FALSE(client->Compile(&context, MakeRequest(), &response).ok());
  EXPECT_EQ(kilnd_->compiler().compiles(), 0);
}

TEST_F(KilndTls, UnixSocketNeedsNoToken) {
  kiln::v1::CompileResponse response;
  EXPECT_TRUE(kilnd_->Compile(MakeRequest(), &response).ok());
}

}  // namespace
}  // namespace kiln::daemon
