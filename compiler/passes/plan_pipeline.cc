// PlanGraph: the passes every compile runs, in order, each recorded for kiln.debug.
#include "compiler/passes/plan_pipeline.h"

#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/conv_folding.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/memory_plan.h"

namespace kiln::compiler {
namespace {

// `graph` returning, after its own outputs, the values of its input updates: every pass keeps a
// graph output alive, materialized, out of the prologue and out of the arena, never merged into
// or replaced by an alias of another value, which is what the plan's writes into the inputs need.
kiln::v1::Graph ReturningUpdatedValues(const kiln::v1::Graph& graph) {
  kiln::v1::Graph out = graph;
  for (const kiln::v1::InputUpdate& u : graph.input_updates()) out.add_outputs(u.value());
  return out;
}

}  // namespace

PlannedGraph PlanGraph(const kiln::v1::CompileRequest& request, kiln::v1::DeviceKind device,
                       const DevicePasses& device_passes) {
  kiln::v1::PassSnapshots snapshots;
  PassLog passes(&snapshots);
  passes.Record("received", request.graph());
  const int returned = request.graph().outputs_size();
  kiln::v1::Graph graph = passes.After(
      "batch norm decomposed", DecomposeBatchNormEval(ReturningUpdatedValues(request.graph())));
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
  kiln::v1::ExecutionPlan* plan = planned.body.mutable_plan();
  *plan = BuildPlan(*planned.graph, planned.program, &bound);
  // The updated values are kept to the end as outputs are (BuildPlan puts none in the arena or a
  // release list), then written into their inputs instead of returned.
  plan->mutable_outputs()->Truncate(returned);
  *plan->mutable_input_updates() = request.graph().input_updates();
  for (const FusedStep& s : planned.program.steps) planned.has_kernels |= s.is_kernel;
  return planned;
}

}  // namespace kiln::compiler
