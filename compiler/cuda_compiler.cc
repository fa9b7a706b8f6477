// The CUDA compile pipeline and its error mapping: targets other than sm_XY and a kilnd without
// NVRTC are CODE_UNIMPLEMENTED, NVRTC failures CODE_TOOLCHAIN; anything the generator cannot
// fuse is a library step (ATen's CUDA kernels).
#include "compiler/cuda_compiler.h"

#include <regex>

#include "absl/strings/str_cat.h"
#include "compiler/passes/conv_folding.h"
#include "compiler/passes/cuda_library_passes.h"
#include "compiler/passes/plan_pipeline.h"

namespace kiln::compiler {
namespace {

// Bump whenever generated code may change for the same graph (codegen, fusion, plan rules,
// NVRTC flags).
constexpr char kCudaCompilerVersion[] = "kiln-cuda-11";

// The architecture kernels are built for, or CODE_UNIMPLEMENTED for a target this compiler does
// not build for.
absl::StatusOr<std::string> TargetArch(const kiln::v1::Target& target) {
  static const std::regex kArch("sm_[0-9]{2,3}a?");
  if (target.device_kind() != kiln::v1::DEVICE_KIND_CUDA) {
    return CompileErrorStatus(kiln::v1::CompileError::CODE_UNIMPLEMENTED, "not a CUDA target");
  }
  if (!target.cpu_isa().empty() || !std::regex_match(target.cuda_arch(), kArch)) {
    return CompileErrorStatus(
        kiln::v1::CompileError::CODE_UNIMPLEMENTED,
        absl::StrCat("unknown cuda_arch '", target.cuda_arch().substr(0, 32), "'"));
  }
  return target.cuda_arch();
}

void SetLaunch(const CudaSource& kernels, kiln::v1::PlanStep& step) {
  if (!step.has_kernel()) return;
  kiln::v1::KernelLaunch* k = step.mutable_kernel();
  const CudaLaunch& launch = kernels.launches.at(k->symbol());
  k->set_symbol(launch.function);
  for (uint32_t g : launch.grid) k->add_grid(g);
  for (uint32_t b : launch.block) k->add_block(b);
  k->set_shared_memory_bytes(launch.shared_memory_bytes);
  if (launch.grid_work) {
    *k->mutable_grid_work() = *launch.grid_work;
    k->set_grid_work_per_block(launch.grid_work_per_block);
    k->set_grid_max(launch.grid_max);
  }
}

}  // namespace

absl::StatusOr<GeneratedCuda> GenerateCuda(const kiln::v1::CompileRequest& request) {
  if (absl::StatusOr<std::string> arch = TargetArch(request.target()); !arch.ok()) {
    return arch.status();
  }
  // ATen's CUDA convolutions add their bias in a pass of their own: a pointwise node fuses it
  // into the kernel that reads the result. A linear's bias goes the other way, into cuBLASLt's
  // epilogue (aten::addmm). Generated depthwise convolutions read their weights with the
  // channels innermost.
  const DevicePasses library_ops = [](kiln::v1::Graph graph, PassLog& passes) {
    graph = passes.After("convolution bias as epilogue", ConvolutionBiasAsEpilogue(graph));
    graph = passes.After("linear bias in the GEMM", LinearBiasAsGemmEpilogue(graph));
    return passes.After("depthwise weights channels innermost",
                        DepthwiseWeightsChannelsInnermost(graph));
  };
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CUDA, library_ops);
  GeneratedCuda generated;
  generated.body = std::move(planned.body);
  if (!planned.has_kernels) return generated;
  kiln::v1::ExecutionPlan* plan = generated.body.mutable_plan();
  CudaSource kernels = GenerateCudaKernels(*planned.graph, planned.program);
  for (kiln::v1::PlanStep& step : *plan->mutable_prologue()) SetLaunch(kernels, step);
  for (kiln::v1::PlanStep& step : *plan->mutable_steps()) SetLaunch(kernels, step);
  generated.source = std::move(kernels.source);
  return generated;
}

CudaCompiler::CudaCompiler(CudaCompilerOptions options)
    : CudaCompiler(Nvrtc::Load(Nvrtc::Candidates(options.nvrtc))) {}

CudaCompiler::CudaCompiler(absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc) {
  if (nvrtc.ok()) {
    nvrtc_ = std::move(*nvrtc);
    version_ = absl::StrCat(kCudaCompilerVersion, "|", nvrtc_->Version());
  } else {
    nvrtc_status_ = nvrtc.status();
    version_ = absl::StrCat(kCudaCompilerVersion, "|no-nvrtc");
  }
}

absl::StatusOr<kiln::v1::ArtifactBody> CudaCompiler::Compile(
    const kiln::v1::CompileRequest& request) {
  absl::StatusOr<std::string> arch = TargetArch(request.target());
  if (!arch.ok()) return arch.status();
  if (nvrtc_ == nullptr) {
    return CompileErrorStatus(
        kiln::v1::CompileError::CODE_UNIMPLEMENTED,
        absl::StrCat("this kilnd builds no CUDA kernels: ", nvrtc_status_.message()));
  }
  absl::StatusOr<GeneratedCuda> generated = GenerateCuda(request);
  if (!generated.ok()) return generated.status();
  kiln::v1::ArtifactBody body = std::move(generated->body);
  if (generated->source.empty()) {
    body.set_format(kiln::v1::BINARY_FORMAT_UNSPECIFIED);
    return body;
  }
  absl::StatusOr<CudaBinary> binary = nvrtc_->Build(generated->source, *arch);
  if (!binary.ok()) {
    return CompileErrorStatus(kiln::v1::CompileError::CODE_TOOLCHAIN,
                              std::string(binary.status().message()));
  }
  body.set_format(kiln::v1::BINARY_FORMAT_CUBIN);
  body.set_kernel_binary(std::move(binary->cubin));
  body.set_kernel_ptx(std::move(binary->ptx));
  body.set_kernel_source(std::move(generated->source));
  return body;
}

}  // namespace kiln::compiler
