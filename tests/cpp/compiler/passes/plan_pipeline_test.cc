// PlanGraph's handling of what a graph declares beside its nodes: input updates become the plan's,
// their values computed per call and kept to the end; ops the graph declares random are never
// merged or cached; a library call carries its op's declared schema.
#include "compiler/passes/plan_pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "compiler/ir/ir_validator.h"
#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/graph_passes.h"
#include "tests/cpp/support/graph_builder.h"

namespace kiln::compiler {
namespace {

using kiln::testing::F;
using kiln::testing::GraphBuilder;
using kiln::testing::I;
using kiln::testing::Ints;
using kiln::testing::None;
using kiln::testing::V;

// Every id the plan releases, over its prologue and steps.
std::set<uint32_t> Released(const kiln::v1::ExecutionPlan& plan) {
  std::set<uint32_t> ids;
  for (const auto* steps : {&plan.prologue(), &plan.steps()}) {
    for (const auto& step : *steps) ids.insert(step.release().begin(), step.release().end());
  }
  return ids;
}

const kiln::v1::Buffer* BufferOf(const kiln::v1::ExecutionPlan& plan, uint32_t id) {
  for (const auto& b : plan.buffers()) {
    if (b.id() == id) return &b;
  }
  return nullptr;
}

TEST(PlanPipelineTest, AnInputUpdateIsThePlansWithItsValueKeptToTheEnd) {
  // x.add_(1); return x * 2, as the lowering writes it: y = x + 1 updates x, z = y * 2 returned.
  GraphBuilder b;
  uint32_t x = b.Input({64, 32});
  uint32_t y = b.Op("aten::add.Tensor", {V(x), F(1.0)}, {64, 32});
  uint32_t z = b.Op("aten::mul.Tensor", {V(y), F(2.0)}, {64, 32});
  uint32_t s = b.Op("aten::sum.dim_IntList", {V(z), Ints({1})}, {64});
  b.Output(s);
  b.Update(x, y);
  const kiln::v1::CompileRequest request = b.Request();
  ASSERT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_EQ(plan.input_updates_size(), 1);
  EXPECT_EQ(plan.input_updates(0).input(), x);
  EXPECT_EQ(plan.input_updates(0).value(), y);
  // Returned: only what the graph returns. The update's value is materialized (a kernel would
  // otherwise keep x + 1 in a register), outside the arena and never released.
  EXPECT_EQ(std::vector<uint32_t>(plan.outputs().begin(), plan.outputs().end()),
            std::vector<uint32_t>{s});
  const kiln::v1::Buffer* buffer = BufferOf(plan, y);
  ASSERT_NE(buffer, nullptr);
  EXPECT_FALSE(buffer->in_arena());
  EXPECT_FALSE(Released(plan).count(y));
}

TEST(PlanPipelineTest, AnUpdatedParametersNewValueIsComputedPerCallNotByThePrologue) {
  // A running statistic's update in a no_grad graph: count = count + 1, written back.
  GraphBuilder b;
  uint32_t count = b.Input({}, kiln::v1::DTYPE_INT64);
  b.Bound(1);
  uint32_t x = b.Input({8});
  uint32_t next = b.Op("aten::add.Tensor", {V(count), I(1)}, {}, kiln::v1::DTYPE_INT64);
  uint32_t out = b.Op("aten::relu", {V(x)}, {8});
  b.Output(out);
  b.Update(count, next);
  const kiln::v1::CompileRequest request = b.Request();
  ASSERT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  EXPECT_EQ(plan.prologue_size(), 0);  // cached once per parameter version, it would count once
  EXPECT_EQ(plan.input_updates(0).value(), next);
  EXPECT_FALSE(Released(plan).count(next));
}

// Two calls of one op with equal arguments over a bound input, its result added.
GraphBuilder TwoCallsOf(const std::string& op, std::vector<std::string> tags) {
  GraphBuilder b;
  uint32_t p = b.Input({16});
  b.Bound(1);
  uint32_t x = b.Input({16});
  uint32_t first = b.Op(op, {V(p), F(0.5)}, {16});
  uint32_t second = b.Op(op, {V(p), F(0.5)}, {16});
  uint32_t sum = b.Op("aten::add.Tensor", {V(first), V(second)}, {16});
  b.Output(b.Op("aten::mul.Tensor", {V(sum), V(x)}, {16}));
  b.Declare(op, op + "(Tensor self, float p) -> Tensor", std::move(tags));
  return b;
}

int Calls(const kiln::v1::Graph& graph, const std::string& op) {
  return static_cast<int>(std::count_if(graph.nodes().begin(), graph.nodes().end(),
                                        [&](const kiln::v1::Node& n) { return n.op() == op; }));
}

TEST(PlanPipelineTest, AnOpTheGraphDeclaresRandomIsNeitherMergedNorCached) {
  const std::string op = "aten::my_noise";
  GraphBuilder pure = TwoCallsOf(op, {"pt2_compliant_tag"});
  EXPECT_EQ(Calls(RunGraphPasses(pure.graph()), op), 1);  // merged
  GraphBuilder random = TwoCallsOf(op, {"nondeterministic_seeded", "pt2_compliant_tag"});
  const kiln::v1::Graph passed = RunGraphPasses(random.graph());
  EXPECT_EQ(Calls(passed, op), 2);  // two draws, as eager makes
  const auto bound = BoundValues(passed);
  for (const kiln::v1::Node& n : passed.nodes()) {
    if (n.op() == op) {
      EXPECT_FALSE(bound.count(n.outputs(0).id())) << "drawn once, reused";
    }
  }
}

TEST(PlanPipelineTest, ALibraryCallCarriesItsOpsDeclaredSchemaAndEveryOutput) {
  const std::string schema =
      "aten::nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, "
      "SymInt ignore_index) -> (Tensor output, Tensor total_weight)";
  GraphBuilder b;
  uint32_t logp = b.Input({4, 5});
  uint32_t target = b.Input({4}, kiln::v1::DTYPE_INT64);
  auto outs =
      b.OpN("aten::nll_loss_forward", {V(logp), V(target), None(), I(1), I(-100)}, {{}, {}});
  b.Output(outs[0]);
  b.Output(outs[1]);
  b.Declare("aten::nll_loss_forward", schema);
  const kiln::v1::CompileRequest request = b.Request();
  ASSERT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_EQ(plan.steps_size(), 1);
  const kiln::v1::LibraryCall& call = plan.steps(0).library();
  EXPECT_EQ(call.schema(), schema);
  EXPECT_EQ(std::vector<uint32_t>(call.outputs().begin(), call.outputs().end()), outs);
}

}  // namespace
}  // namespace kiln::compiler
