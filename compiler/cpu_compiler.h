// CpuCompiler: the code generator kilnd runs for CPU targets. Graph -> fusion -> C++ kernels
// built by the host compiler into one shared object -> an ExecutionPlan over kernels and ATen
// library calls.
#pragma once

#include <chrono>
#include <string>

#include "compiler/compiler.h"
#include "compiler/toolchain.h"

namespace kiln::compiler {

struct CpuCompilerOptions {
  std::string cxx = "g++";            // the host compiler (kilnd: $KILN_CXX)
  std::chrono::seconds timeout{300};  // per shared object
};

class CpuCompiler : public Compiler {
 public:
  explicit CpuCompiler(CpuCompilerOptions options = {});

  absl::StatusOr<kiln::v1::ArtifactBody> Compile(const kiln::v1::CompileRequest& request) override;
  std::string Version() const override { return version_; }

 private:
  Toolchain toolchain_;
  std::string version_;
};

}  // namespace kiln::compiler
