// kilnd's command line, shared by the real binary (daemon/main.cc) and the test build that runs
// it with the test compiler.
#pragma once

#include <functional>
#include <memory>

#include "compiler/compiler.h"

namespace kiln::daemon {

// Runs kilnd: --stats, --stop, --print-paths, --help, or serving (detached unless --foreground).
// Returns the process exit code. `make_compiler` is called once, only when serving.
int KilndMain(int argc, char** argv,
              const std::function<std::unique_ptr<compiler::Compiler>()>& make_compiler);

}  // namespace kiln::daemon
