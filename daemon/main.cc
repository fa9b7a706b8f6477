// kilnd: the kiln compile daemon, with the CPU code generator ($KILN_CXX names the host C++
// compiler, g++ by default) and the CUDA one ($KILN_NVRTC names a libnvrtc.so.* to try before the
// loader's search path). Without NVRTC, CUDA targets answer CODE_UNIMPLEMENTED with the reason and
// clients run those graphs eagerly.
#include <cstdlib>

#include "compiler/cpu_compiler.h"
#include "compiler/cuda_compiler.h"
#include "compiler/target_compiler.h"
#include "daemon/kilnd_main.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::daemon::KilndMain(argc, argv, [] {
    kiln::compiler::CpuCompilerOptions cpu;
    if (std::string cxx = Env("KILN_CXX"); !cxx.empty()) cpu.cxx = cxx;
    kiln::compiler::CudaCompilerOptions cuda;
    cuda.nvrtc = Env("KILN_NVRTC");
    return std::make_unique<kiln::compiler::TargetCompiler>(
        std::make_unique<kiln::compiler::CpuCompiler>(cpu),
        std::make_unique<kiln::compiler::CudaCompiler>(cuda));
  });
}
