// The CPU compile pipeline and its error mapping: unsupported targets are CODE_UNIMPLEMENTED,
// toolchain failures CODE_TOOLCHAIN; anything the generator cannot fuse is a library step.
#include "compiler/cpu_compiler.h"

#include "absl/strings/str_cat.h"
#include "compiler/codegen/cpu/cpp_codegen.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/onednn_passes.h"
#include "compiler/passes/plan_pipeline.h"

namespace kiln::compiler {
namespace {

// Bump whenever generated code may change for the same graph (codegen, fusion, plan rules).
constexpr char kCpuCompilerVersion[] = "kiln-cpu-25";

// The ISA kernels are built for, or CODE_UNIMPLEMENTED for a target this compiler does not know.
absl::StatusOr<std::string> TargetIsa(const kiln::v1::Target& target) {
  if (target.device_kind() != kiln::v1::DEVICE_KIND_CPU) {
    return CompileErrorStatus(kiln::v1::CompileError::CODE_UNIMPLEMENTED,
                              "kilnd compiles CPU targets only; run CUDA graphs eagerly");
  }
  const std::string isa = target.cpu_isa().empty() ? Toolchain::BaselineIsa() : target.cpu_isa();
  if (!Toolchain::KnownIsa(isa)) {
    return CompileErrorStatus(kiln::v1::CompileError::CODE_UNIMPLEMENTED,
                              absl::StrCat("unknown cpu_isa '", isa.substr(0, 32), "'"));
  }
  return isa;
}

}  // namespace

absl::StatusOr<GeneratedCpu> GenerateCpu(const kiln::v1::CompileRequest& request) {
  if (absl::StatusOr<std::string> isa = TargetIsa(request.target()); !isa.ok()) {
    return isa.status();
  }
  DevicePasses onednn = nullptr;
  if (request.target().cpu_onednn()) {
    onednn = [](kiln::v1::Graph graph, PassLog& passes) {
      graph = passes.After("oneDNN convolution", UseOneDnnConvolution(graph));
      graph = passes.After("oneDNN linear", UseOneDnnLinear(graph));
      graph = passes.After("oneDNN linear epilogues", FuseLinearEpilogues(graph));
      graph = passes.After("dead code", EliminateDeadCode(graph));
      return passes.After("in-place residuals", AccumulateResidualsInPlace(graph));
    };
  }
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU, onednn);
  GeneratedCpu generated;
  generated.body = std::move(planned.body);
  if (!planned.has_kernels) return generated;
  CppSource kernels = GenerateCpp(*planned.graph, planned.program);
  kiln::v1::ExecutionPlan* plan = generated.body.mutable_plan();
  for (auto* steps : {plan->mutable_prologue(), plan->mutable_steps()}) {
    for (kiln::v1::PlanStep& step : *steps) {
      if (step.has_kernel()) {
        step.mutable_kernel()->set_symbol(kernels.functions.at(step.kernel().symbol()));
      }
    }
  }
  generated.source = std::move(kernels.source);
  return generated;
}

CpuCompiler::CpuCompiler(CpuCompilerOptions options)
    : toolchain_(options.cxx, options.timeout),
      version_(absl::StrCat(kCpuCompilerVersion, "|", toolchain_.Version())) {}

absl::StatusOr<kiln::v1::ArtifactBody> CpuCompiler::Compile(
    const kiln::v1::CompileRequest& request) {
  absl::StatusOr<std::string> isa = TargetIsa(request.target());
  if (!isa.ok()) return isa.status();
  if (!Toolchain::HostBuildsFor(*isa)) {
    return CompileErrorStatus(
        kiln::v1::CompileError::CODE_UNIMPLEMENTED,
        absl::StrCat("this kilnd does not cross-compile for cpu_isa '", *isa, "'"));
  }
  absl::StatusOr<GeneratedCpu> generated = GenerateCpu(request);
  if (!generated.ok()) return generated.status();
  kiln::v1::ArtifactBody body = std::move(generated->body);
  if (generated->source.empty()) {
    body.set_format(kiln::v1::BINARY_FORMAT_UNSPECIFIED);
    return body;
  }
  auto so = toolchain_.BuildSharedObject(generated->source, *isa);
  if (!so.ok()) {
    return CompileErrorStatus(kiln::v1::CompileError::CODE_TOOLCHAIN,
                              std::string(so.status().message()));
  }
  body.set_format(kiln::v1::BINARY_FORMAT_ELF_SHARED_OBJECT);
  body.set_kernel_binary(std::move(*so));
  body.set_kernel_source(std::move(generated->source));
  return body;
}

}  // namespace kiln::compiler
