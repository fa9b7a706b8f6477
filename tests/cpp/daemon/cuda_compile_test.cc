// kilnd in-process with the compiler main.cc gives it (TargetCompiler over the CPU and CUDA
// compilers): a CUDA request comes back as a signed cubin artifact whose key covers cuda_arch;
// without NVRTC, CUDA requests are CODE_UNIMPLEMENTED while CPU ones still compile.
#include <gtest/gtest.h>

#include "compiler/cpu_compiler.h"
#include "compiler/cuda_compiler.h"
#include "compiler/target_compiler.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/nvrtc_for_tests.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::daemon {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::TempDir;

// MakeRequest's graph (relu(x + x)) on cuda:0 for `arch`.
kiln::v1::CompileRequest CudaRequest(const std::string& arch) {
  kiln::v1::CompileRequest request = MakeRequest();
  request.mutable_target()->Clear();
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CUDA);
  request.mutable_target()->set_cuda_arch(arch);
  kiln::v1::Graph* g = request.mutable_graph();
  for (auto& v : *g->mutable_inputs()) {
    v.mutable_meta()->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CUDA);
  }
  for (auto& n : *g->mutable_nodes()) {
    for (auto& v : *n.mutable_outputs()) {
      v.mutable_meta()->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CUDA);
    }
  }
  return request;
}

class KilndCuda {
 public:
  KilndCuda(const TempDir& dir, absl::StatusOr<std::unique_ptr<compiler::Nvrtc>> nvrtc)
      : compiler_(std::make_unique<compiler::CpuCompiler>(),
                  std::make_unique<compiler::CudaCompiler>(std::move(nvrtc))) {
    config_.cache_dir = dir.Sub("cache");
    config_.socket_path = dir.Sub("run/kilnd.sock");
    EXPECT_TRUE(FinishConfig(config_).ok());
    daemon_ = std::make_unique<Daemon>(config_, &compiler_);
    EXPECT_TRUE(daemon_->Start().ok());
  }
  ~KilndCuda() {
    daemon_->RequestShutdown();
    daemon_->Wait();
  }
  kiln::v1::CompileResponse Compile(const kiln::v1::CompileRequest& request) {
    auto client = kiln::v1::KilnService::NewStub(
        grpc::CreateChannel("unix:" + config_.socket_path, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    kiln::v1::CompileResponse response;
    grpc::Status status = client->Compile(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

 private:
  compiler::TargetCompiler compiler_;
  DaemonConfig config_;
  std::unique_ptr<Daemon> daemon_;
};

TEST(KilndCuda, CudaRequestGetsACubinArtifactKeyedByArchitecture) {
  std::string why;
  std::unique_ptr<compiler::Nvrtc> nvrtc = kiln::testing::LoadNvrtcForTests(&why);
  if (nvrtc == nullptr) {
    if (!kiln::testing::NvrtcRequired()) GTEST_SKIP() << "SKIPPED: " << why;
    FAIL() << why << " (set KILN_NVRTC, or KILN_NVRTC_REQUIRED=0 to skip)";
  }
  TempDir dir;
  KilndCuda kilnd(dir, std::move(nvrtc));
  const kiln::v1::CompileResponse sm90 = kilnd.Compile(CudaRequest("sm_90"));
  ASSERT_TRUE(sm90.has_artifact()) << sm90.error().message();
  kiln::v1::ArtifactBody body;
  ASSERT_TRUE(body.ParseFromString(sm90.artifact().body()));
  EXPECT_EQ(body.format(), kiln::v1::BINARY_FORMAT_CUBIN);
  EXPECT_EQ(body.kernel_binary().substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_NE(body.kernel_ptx().find(".target sm_90"), std::string::npos);
  EXPECT_EQ(body.target().cuda_arch(), "sm_90");
  EXPECT_NE(body.compiler_version().find("kiln-cuda-11|nvrtc-"), std::string::npos);
  EXPECT_EQ(sm90.artifact().mac().size(), 32u);

  const kiln::v1::CompileResponse sm80 = kilnd.Compile(CudaRequest("sm_80"));
  ASSERT_TRUE(sm80.has_artifact()) << sm80.error().message();
  EXPECT_NE(sm80.key(), sm90.key());
  EXPECT_TRUE(kilnd.Compile(CudaRequest("sm_90")).cache_hit());
}

TEST(KilndCuda, WithoutNvrtcCudaIsUnimplementedAndCpuStillCompiles) {
  TempDir dir;
  KilndCuda kilnd(dir, compiler::Nvrtc::Load({"/nonexistent/libnvrtc.so.13"}));
  const kiln::v1::CompileResponse cuda = kilnd.Compile(CudaRequest("sm_90"));
  ASSERT_TRUE(cuda.has_error());
  EXPECT_EQ(cuda.error().code(), kiln::v1::CompileError::CODE_UNIMPLEMENTED);
  EXPECT_NE(cuda.error().message().find("no NVRTC"), std::string::npos);
  EXPECT_TRUE(kilnd.Compile(MakeRequest()).has_artifact());
}

}  // namespace
}  // namespace kiln::daemon
