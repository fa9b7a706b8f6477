// CpuCompiler: the code generator kilnd runs for CPU targets. Graph -> fusion -> C++ kernels
// built by the host compiler into one shared object -> an ExecutionPlan over kernels and ATen
// library calls.
#pragma once

#include <chrono>
#include <string>

#include "compiler/compiler.h"
#include "compiler/toolchain/toolchain.h"

namespace kiln::compiler {

// Everything a CPU compile makes before the host compiler runs: the plan (with the pass
// snapshots) and the C++ source of its kernels (empty when the plan has none).
struct GeneratedCpu {
  kiln::v1::ArtifactBody body;
  std::string source;
};

// The CPU pipeline up to code generation, for a request that passed ValidateRequest: graph
// passes, fusion, the plan and the kernels' source. Fails with a CompileErrorStatus for a target
// it does not know. Builds nothing, so it runs on any host (and under the fuzzer).
absl::StatusOr<GeneratedCpu> GenerateCpu(const kiln::v1::CompileRequest& request);

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
