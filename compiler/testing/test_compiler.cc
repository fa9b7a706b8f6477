// TestCompiler: one library call per node, and a "binary" derived from the graph bytes.
#include "compiler/testing/test_compiler.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace kiln::compiler {

absl::StatusOr<kiln::v1::ArtifactBody> TestCompiler::Compile(
    const kiln::v1::CompileRequest& request) {
  ++compiles_;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !held_; });
  }
  if (options_.delay.count() > 0) std::this_thread::sleep_for(options_.delay);
  const kiln::v1::Graph& graph = request.graph();
  kiln::v1::ArtifactBody body;
  body.set_format(kiln::v1::BINARY_FORMAT_TEST);
  kiln::v1::ExecutionPlan* plan = body.mutable_plan();
  for (const auto& input : graph.inputs()) {
    plan->add_inputs(input.id());
    *plan->add_values() = input;
  }
  *plan->mutable_constants() = graph.constants();
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const kiln::v1::Node& node = graph.nodes(i);
    if (!options_.fail_op.empty() && node.op() == options_.fail_op) {
      kiln::v1::CompileError error;
      error.set_code(kiln::v1::CompileError::CODE_UNSUPPORTED_OP);
      error.set_message(absl::StrCat("test compiler refuses ", node.op()));
      error.set_node_index(i);
      return CompileErrorStatus(error);
    }
    kiln::v1::LibraryCall* call = plan->add_steps()->mutable_library();
    call->set_op(node.op());
    *call->mutable_args() = node.args();
    for (const auto& out : node.outputs()) {
      call->add_outputs(out.id());
      *plan->add_values() = out;
    }
  }
  *plan->mutable_outputs() = graph.outputs();
  body.set_kernel_binary(
      absl::StrCat("kiln-test-kernel:", graph.SerializeAsString().size(), ":", graph.nodes_size()));
  return body;
}

void TestCompiler::Hold() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = true;
}

void TestCompiler::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
  }
  cv_.notify_all();
}

}  // namespace kiln::compiler
