// kilnd: the kiln compile daemon. Until the code generator lands it runs UnimplementedCompiler,
// so every miss answers CODE_UNIMPLEMENTED and clients run eagerly.
#include "compiler/compiler.h"
#include "daemon/kilnd_main.h"

int main(int argc, char** argv) {
  return kiln::daemon::KilndMain(
      argc, argv, [] { return std::make_unique<kiln::compiler::UnimplementedCompiler>(); });
}
