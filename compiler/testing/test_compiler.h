// TestCompiler: a deterministic stand-in for the code generator, for tests of the daemon and
// the cache. Its artifact is a pure function of the request; it can be slowed down, held at a
// gate until the test releases it, made to fail on one op, and it counts the compiles it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "compiler/compiler.h"

namespace kiln::compiler {

struct TestCompilerOptions {
  std::chrono::milliseconds delay{0};  // Time each compile takes.
  std::string fail_op;  // A node with this op fails with CODE_UNSUPPORTED_OP (empty: none).
  std::string version = "kiln-test-compiler-1";
};

class TestCompiler : public Compiler {
 public:
  explicit TestCompiler(TestCompilerOptions options = {}) : options_(std::move(options)) {}

  absl::StatusOr<kiln::v1::ArtifactBody> Compile(const kiln::v1::CompileRequest& request) override;
  std::string Version() const override { return options_.version; }

  // Compiles that have started (counted before the gate and the delay).
  int compiles() const { return compiles_.load(); }

  // While held, every compile waits at the gate after it is counted; Release lets them all go.
  void Hold();
  void Release();

 private:
  const TestCompilerOptions options_;
  std::atomic<int> compiles_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
};

}  // namespace kiln::compiler
