// Dispatch on Target.device_kind; the version joins both compilers' versions.
#include "compiler/target_compiler.h"

#include "absl/strings/str_cat.h"

namespace kiln::compiler {

TargetCompiler::TargetCompiler(std::unique_ptr<Compiler> cpu, std::unique_ptr<Compiler> cuda)
    : cpu_(std::move(cpu)),
      cuda_(std::move(cuda)),
      version_(absl::StrCat(cpu_->Version(), "||", cuda_->Version())) {}

std::string TargetCompiler::VersionFor(kiln::v1::DeviceKind kind) const {
  return kind == kiln::v1::DEVICE_KIND_CUDA ? cuda_->Version() : cpu_->Version();
}

absl::StatusOr<kiln::v1::ArtifactBody> TargetCompiler::Compile(
    const kiln::v1::CompileRequest& request) {
  switch (request.target().device_kind()) {
    case kiln::v1::DEVICE_KIND_CPU:
      return cpu_->Compile(request);
    case kiln::v1::DEVICE_KIND_CUDA:
      return cuda_->Compile(request);
    default:
      return CompileErrorStatus(kiln::v1::CompileError::CODE_UNIMPLEMENTED,
                                "target has no device kind kilnd compiles for");
  }
}

}  // namespace kiln::compiler
