// PlanGraph: the passes every compile runs, in order, each recorded for kiln.debug.
#include "compiler/passes/plan_pipeline.h"

#include "compiler/ir/graph_index.h"
#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/conv_folding.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/memory_plan.h"
#include "compiler/passes/symbolic_fusion.h"
#include "compiler/ir/sym_expr.h"

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

// Every node of `graph` a library step, in order: a graph whose representative sizes overflow
// runs as ATen's calls from one plan that evaluates every size per call.
FusedProgram LibrarySteps(const kiln::v1::Graph& graph) {
  FusedProgram program;
  program.meta = IndexValues(graph).meta;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    FusedStep step;
    step.node = i;
    program.steps.push_back(step);
  }
  return program;
}

// The pipeline of a graph with size symbols: only passes that read no size (dead code, bound
// work first; the updated values kept as outputs are), then kernels whose outer extent is a runtime value where the fuser's decisions
// hold for every size (FuseSymbolicGraph), library steps for the rest. The plan names the
// graph's values with their size expressions; the generators read the kernels' graph.
PlannedGraph PlanSymbolicGraph(const kiln::v1::CompileRequest& request, kiln::v1::DeviceKind device,
                               kiln::v1::PassSnapshots& snapshots, PassLog& passes) {
  const int returned = request.graph().outputs_size();
  kiln::v1::Graph graph =
      passes.After("dead code", EliminateDeadCode(ReturningUpdatedValues(request.graph())));
  const std::unordered_set<uint32_t> bound = BoundValues(graph);
  PlannedGraph planned;
  planned.graph = std::make_unique<kiln::v1::Graph>(
      passes.After("bound nodes first", BoundNodesFirst(graph, bound)));
  planned.body.set_pass_snapshots(CompressPassSnapshots(snapshots));
  kiln::v1::ExecutionPlan* plan = planned.body.mutable_plan();
  std::optional<SymbolicFusion> fused = FuseSymbolicGraph(*planned.graph, &bound, device);
  if (!fused) {
    planned.program = LibrarySteps(*planned.graph);
    *plan = BuildPlan(*planned.graph, planned.program, &bound);
  } else {
    // The plan's values keep their expressions: the same steps over the symbolic graph's metas.
    FusedProgram over_symbols = fused->program;
    over_symbols.meta = IndexValues(*planned.graph).meta;
    *plan = BuildPlan(*planned.graph, over_symbols, &bound);
    planned.graph = std::move(fused->kernels_graph);
    planned.program = std::move(fused->program);
    for (const FusedStep& s : planned.program.steps) planned.has_kernels |= s.is_kernel;
  }
  *plan->mutable_size_symbols() = request.graph().size_symbols();
  plan->mutable_outputs()->Truncate(returned);  // the updated values: written, not returned
  *plan->mutable_input_updates() = request.graph().input_updates();
  return planned;
}

}  // namespace

PlannedGraph PlanGraph(const kiln::v1::CompileRequest& request, kiln::v1::DeviceKind device,
                       const DevicePasses& device_passes) {
  kiln::v1::PassSnapshots snapshots;
  PassLog passes(&snapshots);
  passes.Record("received", request.graph());
  if (IsSymbolic(request.graph())) return PlanSymbolicGraph(request, device, snapshots, passes);
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
