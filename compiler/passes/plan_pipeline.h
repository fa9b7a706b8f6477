// The front of every compile, whatever the device: the graph as received, the graph passes,
// convolution-affine folding, the device's own passes, bound work first, fusion and the
// ExecutionPlan. The CPU and CUDA compilers differ only in their device passes and in the kernel
// source they generate from the result.
#pragma once

#include <functional>
#include <memory>
#include <unordered_set>

#include "compiler/passes/fusion.h"
#include "compiler/passes/pass_log.h"
#include "kiln/v1/artifact.pb.h"
#include "kiln/v1/graph.pb.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compiler {

// What the pipeline leaves for the code generator. `program` points into `*graph`, which is why
// the graph is held by pointer: it never moves.
struct PlannedGraph {
  kiln::v1::ArtifactBody body;             // The plan and the compressed pass snapshots.
  std::unique_ptr<kiln::v1::Graph> graph;  // The graph the plan and the kernels are made from.
  FusedProgram program;
  bool has_kernels = false;  // Some step launches a generated kernel.
};

// Passes of one device kind, run after folding and before bound work is ordered: each takes the
// graph and returns it rewritten, recording itself in `passes`.
using DevicePasses = std::function<kiln::v1::Graph(kiln::v1::Graph, PassLog& passes)>;

// Runs the pipeline over `request` (validated) for `device` (which generated kernels may run
// on). Never fails: what cannot be fused is a library step. The graph's input updates become the
// plan's, their values computed and kept to the end as the graph's outputs are.
PlannedGraph PlanGraph(const kiln::v1::CompileRequest& request, kiln::v1::DeviceKind device,
                       const DevicePasses& device_passes = nullptr);

}  // namespace kiln::compiler
