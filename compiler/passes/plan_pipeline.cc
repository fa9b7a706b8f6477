// PlanGraph: the passes every compile runs, in order, each recorded for kiln.debug.
#include "compiler/passes/plan_pipeline.h"

#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/conv_folding.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/memory_plan.h"

namespace kiln::compiler {

PlannedGraph PlanGraph(const kiln::v1::CompileRequest& request, kiln::v1::DeviceKind device,
                       const DevicePasses& device_passes) {
  kiln::v1::PassSnapshots snapshots;
  PassLog passes(&snapshots);
  passes.Record("received", request.graph());
  kiln::v1::Graph graph =
      passes.After("batch norm decomposed", DecomposeBatchNormEval(request.graph()));
  graph = RunGraphPasses(graph, nullptr, &passes);
  graph = passes.After("fold convolution affine", FoldConvolutionAffine(graph));
  graph = passes.After("dead code", EliminateDeadCode(graph));
  if (device_passes) graph = device_passes(std::move(graph), passes);
  const std::unordered_set<uint32_t> bound = BoundValues(graph);
  PlannedGraph planned;
  planned.graph = std::make_unique<kiln::v1::Graph>(
      passes.After("bound nodes first", BoundNodesFirst(graph, bound)));
  planned.body.set_pass_snapshots(CompressPassSnapshots(snapshots));
  planned.program = FuseGraph(*planned.graph, &bound, device);
  *planned.body.mutable_plan() = BuildPlan(*planned.graph, planned.program, &bound);
  for (const FusedStep& s : planned.program.steps) planned.has_kernels |= s.is_kernel;
  return planned;
}

}  // namespace kiln::compiler
