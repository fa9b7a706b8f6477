// libFuzzer entry for the CPU and CUDA compilers: every request that passes ValidateRequest (the
// daemon's gate) goes through kilnd's whole pipeline up to the host compiler (GenerateCpu: graph
// passes, convolution folding, the oneDNN rewrites, fusion, the plan and the kernels' C++), and
// the same graph moved to cuda:0 up to NVRTC (GenerateCuda). Nothing is built, so the fuzzer
// runs anywhere and fast.
//
// Beyond "no crash, no sanitizer report", it checks what the client relies on when it loads a
// plan: every value a step, an input or an output names is described in the plan; every kernel
// step names a function of the generated source, and there is source exactly when there are
// kernel steps; buffers in the arena lie inside it; a CUDA kernel step has a grid and a block of
// three dims each, with blocks of whole warps.
#include <google/protobuf/stubs/logging.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unordered_set>

#include "compiler/cpu_compiler.h"
#include "compiler/cuda_compiler.h"
#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_allowlist.h"
#include "kiln/v1/service.pb.h"
#include "tests/fuzz/fuzz_checks.h"

namespace {

using kiln::fuzz::Allowlist;
using kiln::fuzz::Check;

void CheckSteps(const google::protobuf::RepeatedPtrField<kiln::v1::PlanStep>& steps,
                const std::unordered_set<uint32_t>& described, const std::string& source, bool cuda,
                bool* has_kernels) {
  for (const kiln::v1::PlanStep& step : steps) {
    if (step.has_kernel()) {
      *has_kernels = true;
      const kiln::v1::KernelLaunch& k = step.kernel();
      if (cuda) {
        Check(k.grid_size() == 3 && k.block_size() == 3, "CUDA launch without grid and block");
        Check(k.grid(0) >= 1 && k.block(0) % 32 == 0 && k.block(0) <= 1024,
              "CUDA launch of no block or of a block that is not whole warps");
      }
      Check(!k.symbol().empty() && source.find(k.symbol()) != std::string::npos,
            "kernel step names no function of the generated source:", k.symbol());
      for (uint32_t id : k.args()) Check(described.count(id) != 0, "kernel argument undescribed");
      for (uint32_t id : k.writes()) Check(described.count(id) != 0, "kernel write undescribed");
    } else {
      Check(step.has_library(), "plan step is neither a kernel nor a library call");
      for (uint32_t id : step.library().outputs()) {
        Check(described.count(id) != 0, "library output undescribed");
      }
      for (const kiln::v1::Argument& a : step.library().args()) {
        if (a.has_value()) Check(described.count(a.value()) != 0, "library argument undescribed");
      }
    }
  }
}

// What the client relies on in a generated plan (see the top of this file).
void CheckPlan(const kiln::v1::CompileRequest& request, const kiln::v1::ExecutionPlan& plan,
               const std::string& source, bool cuda) {
  std::unordered_set<uint32_t> described;
  for (const kiln::v1::Value& v : plan.values()) described.insert(v.id());
  for (const kiln::v1::Constant& c : plan.constants()) described.insert(c.value().id());
  for (uint32_t id : plan.inputs()) Check(described.count(id) != 0, "plan input undescribed");
  for (uint32_t id : plan.outputs()) Check(described.count(id) != 0, "plan output undescribed");
  Check(plan.inputs_size() == request.graph().inputs_size(), "plan inputs differ from the graph's");
  Check(plan.outputs_size() == request.graph().outputs_size(),
        "plan outputs differ from the graph's");
  bool has_kernels = false;
  CheckSteps(plan.steps(), described, source, cuda, &has_kernels);
  CheckSteps(plan.prologue(), described, source, cuda, &has_kernels);
  Check(has_kernels == !source.empty(), "source without kernels, or kernels without");
  for (const kiln::v1::Buffer& b : plan.buffers()) {
    Check(described.count(b.id()) != 0, "buffer undescribed");
    if (b.in_arena()) {
      Check(b.arena_offset() % 64 == 0, "arena offset not 64-byte aligned");
      Check(b.arena_offset() < plan.arena_bytes(), "buffer outside the arena");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // see fuzz_compile_request.cc
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > static_cast<size_t>(INT_MAX)) return 0;
  kiln::v1::CompileRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // Every graph reaches the CPU pipeline, whatever target the bytes named (a CUDA target is
  // answered UNIMPLEMENTED before any pass runs); oneDNN as the input says.
  const bool onednn = request.target().cpu_onednn();
  request.clear_target();
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
  request.mutable_target()->set_cpu_onednn(onednn);
  if (!kiln::compiler::ValidateRequest(request, Allowlist()).ok()) return 0;

  absl::StatusOr<kiln::compiler::GeneratedCpu> generated = kiln::compiler::GenerateCpu(request);
  Check(generated.ok(), "a valid CPU request fails before the toolchain:",
        generated.ok() ? "" : std::string(generated.status().message()));
  CheckPlan(request, generated->body.plan(), generated->source, false);

  // The same graph on cuda:0, through the CUDA pipeline.
  kiln::v1::CompileRequest cuda = request;
  cuda.clear_target();
  cuda.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CUDA);
  cuda.mutable_target()->set_cuda_arch("sm_90");
  kiln::v1::Graph* g = cuda.mutable_graph();
  auto to_cuda = [](kiln::v1::TensorMeta* m) {
    m->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CUDA);
    m->mutable_device()->set_index(0);
  };
  for (auto& v : *g->mutable_inputs()) to_cuda(v.mutable_meta());
  for (auto& c : *g->mutable_constants()) to_cuda(c.mutable_value()->mutable_meta());
  for (auto& n : *g->mutable_nodes()) {
    for (auto& v : *n.mutable_outputs()) to_cuda(v.mutable_meta());
  }
  if (!kiln::compiler::ValidateRequest(cuda, Allowlist()).ok()) return 0;
  absl::StatusOr<kiln::compiler::GeneratedCuda> generated_cuda = kiln::compiler::GenerateCuda(cuda);
  Check(generated_cuda.ok(), "a valid CUDA request fails before NVRTC:",
        generated_cuda.ok() ? "" : std::string(generated_cuda.status().message()));
  CheckPlan(cuda, generated_cuda->body.plan(), generated_cuda->source, true);
  return 0;
}
