// kilnd: the kiln compile daemon, with the CPU code generator ($KILN_CXX names the host C++
// compiler, g++ by default). CUDA targets answer CODE_UNIMPLEMENTED and clients run eagerly.
#include <cstdlib>

#include "compiler/cpu_compiler.h"
#include "daemon/kilnd_main.h"

int main(int argc, char** argv) {
  return kiln::daemon::KilndMain(argc, argv, [] {
    kiln::compiler::CpuCompilerOptions options;
    if (const char* cxx = std::getenv("KILN_CXX"); cxx != nullptr && *cxx != '\0') {
      options.cxx = cxx;
    }
    return std::make_unique<kiln::compiler::CpuCompiler>(options);
  });
}
