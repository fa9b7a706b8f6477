// TargetCompiler: the compiler kilnd runs, serving every device kind by handing each request to
// the compiler of its target's kind (CPU or CUDA).
#pragma once

#include <memory>
#include <string>

#include "compiler/compiler.h"

namespace kiln::compiler {

class TargetCompiler : public Compiler {
 public:
  TargetCompiler(std::unique_ptr<Compiler> cpu, std::unique_ptr<Compiler> cuda);

  // The compiler of request.target().device_kind(); CODE_UNIMPLEMENTED for any other kind.
  absl::StatusOr<kiln::v1::ArtifactBody> Compile(const kiln::v1::CompileRequest& request) override;
  // "<cpu version>||<cuda version>": what Health reports as the daemon's compiler.
  std::string Version() const override { return version_; }
  // The CPU or the CUDA compiler's own version: a request's key and its artifact's
  // compiler_version depend only on the compiler that builds it.
  std::string VersionFor(kiln::v1::DeviceKind kind) const override;

 private:
  std::unique_ptr<Compiler> cpu_;
  std::unique_ptr<Compiler> cuda_;
  std::string version_;
};

}  // namespace kiln::compiler
