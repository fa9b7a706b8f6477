// kilnd running the TestCompiler, for tests that need a real daemon process. The compile delay
// comes from KILN_TEST_COMPILE_DELAY_MS (default 0).
#include <cstdlib>

#include "compiler/testing/test_compiler.h"
#include "daemon/kilnd_main.h"

int main(int argc, char** argv) {
  return kiln::daemon::KilndMain(argc, argv, [] {
    kiln::compiler::TestCompilerOptions options;
    if (const char* delay = std::getenv("KILN_TEST_COMPILE_DELAY_MS")) {
      options.delay = std::chrono::milliseconds(std::atoi(delay));
    }
    return std::make_unique<kiln::compiler::TestCompiler>(options);
  });
}
