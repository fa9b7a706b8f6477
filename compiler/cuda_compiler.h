// CudaCompiler: the code generator kilnd runs for CUDA targets. Graph -> fusion -> CUDA C++
// kernels built by NVRTC (loaded at run time; no GPU needed) into a cubin for the target's
// architecture plus PTX -> an ExecutionPlan over kernels and ATen library calls (cuBLAS, cuDNN).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "compiler/codegen/cuda/cuda_codegen.h"
#include "compiler/compiler.h"
#include "compiler/toolchain/nvrtc.h"

namespace kiln::compiler {

// Everything a CUDA compile makes before NVRTC runs: the plan (launch configurations filled in,
// pass snapshots) and the CUDA C++ of its kernels (empty when the plan has none).
struct GeneratedCuda {
  kiln::v1::ArtifactBody body;
  std::string source;
};

// The CUDA pipeline up to code generation, for a request that passed ValidateRequest: the
// device-neutral graph passes, fusion of CUDA values, the plan and the kernels' source. Fails
// with CODE_UNIMPLEMENTED for a target that is not CUDA with a cuda_arch like sm_90 or sm_90a
// (and no cpu_isa). Builds nothing, so it runs on any host (and under the fuzzer).
absl::StatusOr<GeneratedCuda> GenerateCuda(const kiln::v1::CompileRequest& request);

struct CudaCompilerOptions {
  std::string nvrtc;  // a libnvrtc.so.* tried before the loader's search (kilnd: $KILN_NVRTC)
};

class CudaCompiler : public Compiler {
 public:
  // Loads NVRTC (Nvrtc::Candidates(options.nvrtc)). Without it the compiler still answers:
  // every compile fails with CODE_UNIMPLEMENTED and the reason (NvrtcStatus()).
  explicit CudaCompiler(CudaCompilerOptions options = {});
  // With NVRTC already loaded, or the reason it is not.
  explicit CudaCompiler(absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc);

  absl::StatusOr<kiln::v1::ArtifactBody> Compile(const kiln::v1::CompileRequest& request) override;
  // "kiln-cuda-<n>|nvrtc-<major>.<minor>", or "kiln-cuda-<n>|no-nvrtc".
  std::string Version() const override { return version_; }

  // OK when NVRTC loaded; else why not.
  const absl::Status& NvrtcStatus() const { return nvrtc_status_; }

 private:
  std::unique_ptr<Nvrtc> nvrtc_;
  absl::Status nvrtc_status_;
  std::string version_;
};

}  // namespace kiln::compiler
