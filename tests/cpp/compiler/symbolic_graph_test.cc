// Graphs with size symbols: what validation accepts and refuses of their expressions and
// bindings, and the plan the pipeline makes of them (kernels over a runtime outer extent where
// every access walks the symbolic dims as one block, library steps elsewhere, values keeping
// their expressions, the symbols passed on for the runtime to bind per call).
#include <gtest/gtest.h>

#include "compiler/ir/ir_validator.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/passes/plan_pipeline.h"
#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/symbolic_meta.h"

namespace kiln::compiler {
namespace {

using kiln::testing::GraphBuilder;
using kiln::testing::AddSizeSymbols;
using kiln::testing::B;
using kiln::testing::Ints;
using kiln::testing::SetSymbolic;
using kiln::testing::Term;
using kiln::testing::V;
using kiln::v1::SymExpr;

// w [8] bound; x [s0, 8] per call -> y = relu(x) * w -> z = view(y, [s0 * 8]).
struct Mlp {
  GraphBuilder b;
  uint32_t w, x, y, z, r;
  kiln::v1::CompileRequest request;
  Mlp() {
    w = b.Input({8});
    x = b.Input({2, 8});
    b.Bound(1);
    r = b.Op("aten::relu", {V(x)}, {2, 8});
    y = b.Op("aten::mul.Tensor", {V(r), V(w)}, {2, 8});
    kiln::v1::Argument shape;
    *shape.mutable_sym_int_list()->add_values() = Term(8, {0});
    z = b.Op("aten::view", {V(y), shape}, {16});
    b.Output(z);
    request = b.Request();
    kiln::v1::Graph* g = request.mutable_graph();
    SetSymbolic(g->mutable_inputs(1)->mutable_meta(), {Term(1, {0}), Term(8)});
    SetSymbolic(g->mutable_nodes(0)->mutable_outputs(0)->mutable_meta(), {Term(1, {0}), Term(8)});
    SetSymbolic(g->mutable_nodes(1)->mutable_outputs(0)->mutable_meta(), {Term(1, {0}), Term(8)});
    SetSymbolic(g->mutable_nodes(2)->mutable_outputs(0)->mutable_meta(), {Term(8, {0})});
    auto* s = g->add_size_symbols();
    s->set_id(0);
    s->set_input(x);
    s->set_dim(0);
    s->set_min(2);
  }
};

std::string Problem(const kiln::v1::CompileRequest& request) {
  return std::string(ValidateRequest(request, OpAllowlist::Default()).message());
}

TEST(SymbolicGraph, AWellFormedGraphWithSizeSymbolsValidates) {
  Mlp m;
  EXPECT_EQ(Problem(m.request), "");
}

TEST(SymbolicGraph, ExpressionsMustBeCanonicalOverDeclaredSymbols) {
  Mlp m;
  auto undeclared = m.request;
  *undeclared.mutable_graph()->mutable_nodes(2)->mutable_args(1)->mutable_sym_int_list()
       ->mutable_values(0) = Term(8, {1});
  EXPECT_NE(Problem(undeclared).find("symbol 1 is not declared"), std::string::npos)
      << Problem(undeclared);
  auto zero = m.request;
  zero.mutable_graph()->mutable_nodes(2)->mutable_args(1)->mutable_sym_int_list()
      ->mutable_values(0)->mutable_terms(0)->set_coefficient(0);
  EXPECT_NE(Problem(zero).find("coefficient 0"), std::string::npos) << Problem(zero);
  // s0 + 1 written with the constant term last, then twice the same term.
  auto unsorted = m.request;
  auto* size = unsorted.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()
                   ->mutable_size_exprs(0);
  auto* one = size->add_terms();
  one->set_coefficient(1);
  EXPECT_NE(Problem(unsorted).find("not sorted"), std::string::npos) << Problem(unsorted);
  auto twice = m.request;
  *twice.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()
       ->mutable_size_exprs(0)->add_terms() = Term(2, {0}).terms(0);
  EXPECT_NE(Problem(twice).find("same symbols"), std::string::npos) << Problem(twice);
}

TEST(SymbolicGraph, StaticSizesMustAgreeWithTheirExpressions) {
  Mlp m;
  auto stated = m.request;  // a symbolic size must read -1
  stated.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->set_sizes(0, 2);
  EXPECT_NE(Problem(stated).find("disagrees with its expression"), std::string::npos)
      << Problem(stated);
  auto constant = m.request;  // a constant one its value
  constant.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->set_sizes(1, 9);
  EXPECT_NE(Problem(constant).find("disagrees"), std::string::npos) << Problem(constant);
  auto missing = m.request;  // one expression per dimension
  missing.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()
      ->mutable_stride_exprs()->RemoveLast();
  EXPECT_NE(Problem(missing).find("one per dimension"), std::string::npos) << Problem(missing);
}

TEST(SymbolicGraph, EachSymbolIsAPerCallInputsDimension) {
  Mlp m;
  auto bound = m.request;  // the bound parameter cannot give a size per call
  bound.mutable_graph()->mutable_size_symbols(0)->set_input(m.w);
  EXPECT_NE(Problem(bound).find("not a per-call input"), std::string::npos) << Problem(bound);
  auto other_dim = m.request;
  other_dim.mutable_graph()->mutable_size_symbols(0)->set_dim(1);
  EXPECT_NE(Problem(other_dim).find("is not this symbol"), std::string::npos)
      << Problem(other_dim);
  auto range = m.request;
  range.mutable_graph()->mutable_size_symbols(0)->set_max(1);
  EXPECT_NE(Problem(range).find("malformed range"), std::string::npos) << Problem(range);
  auto twice = m.request;
  *twice.mutable_graph()->add_size_symbols() = twice.graph().size_symbols(0);
  EXPECT_NE(Problem(twice).find("declared twice"), std::string::npos) << Problem(twice);
}

TEST(SymbolicGraph, ExpressionsNeedSymbols) {
  Mlp m;
  auto no_symbols = m.request;
  no_symbols.mutable_graph()->clear_size_symbols();
  EXPECT_NE(Problem(no_symbols).find("without size symbols"), std::string::npos)
      << Problem(no_symbols);
  GraphBuilder b;  // a static graph may not pass a SymInt either
  uint32_t x = b.Input({4});
  kiln::v1::Argument shape;
  *shape.mutable_sym_int_list()->add_values() = Term(4);
  b.Output(b.Op("aten::view", {V(x), shape}, {4}));
  EXPECT_NE(Problem(b.Request()).find("SymInt argument in a static graph"), std::string::npos)
      << Problem(b.Request());
}

TEST(SymbolicGraph, AnInputUpdateWritesAValueOfTheInputsSizeExpressionsInItsLayout) {
  Mlp m;
  auto updates = m.request;
  updates.mutable_graph()->add_input_updates()->set_input(m.x);
  updates.mutable_graph()->mutable_input_updates(0)->set_value(m.r);  // [s0, 8] into [s0, 8]
  EXPECT_EQ(Problem(updates), "");
  auto other_sizes = updates;
  other_sizes.mutable_graph()->mutable_input_updates(0)->set_value(m.z);  // [8 * s0]
  EXPECT_NE(Problem(other_sizes).find("other sizes than its input"), std::string::npos)
      << Problem(other_sizes);
  auto other_exprs = updates;  // the same sizes at the example, another expression
  SetSymbolic(other_exprs.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta(),
              {Term(1, {0}), Term(8)});
  *other_exprs.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()
       ->mutable_size_exprs(1) = Term(4, {0});
  EXPECT_NE(Problem(other_exprs), "");
  auto restrided = updates;
  *restrided.mutable_graph()->mutable_input_updates(0)->mutable_new_meta() =
      restrided.graph().inputs(1).meta();
  EXPECT_NE(Problem(restrided).find("changes an input's layout"), std::string::npos)
      << Problem(restrided);
}

TEST(SymbolicGraph, PointwiseNodesBecomeOneKernelOverARuntimeOuterExtent) {
  Mlp m;
  ASSERT_EQ(Problem(m.request), "");
  PlannedGraph planned = PlanGraph(m.request, kiln::v1::DEVICE_KIND_CPU);
  EXPECT_TRUE(planned.has_kernels);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_EQ(plan.steps_size(), 2);
  const kiln::v1::KernelLaunch& k = plan.steps(0).kernel();
  // relu and mul over [s0, 8]: one kernel over s0 * 8 elements, s0 passed per call.
  EXPECT_EQ(std::vector<uint32_t>(k.args().begin(), k.args().end()),
            (std::vector<uint32_t>{m.x, m.w, m.y}));
  ASSERT_EQ(k.size_args_size(), 1);
  EXPECT_EQ(k.size_args(0).SerializeAsString(), Term(1, {0}).SerializeAsString());
  EXPECT_EQ(plan.steps(1).library().op(), "aten::view");
  EXPECT_EQ(plan.steps(1).library().args(1).sym_int_list().SerializeAsString(),
            m.request.graph().nodes(2).args(1).sym_int_list().SerializeAsString());
  // The kernel's result is sized per call: a buffer outside the arena.
  ASSERT_EQ(plan.buffers_size(), 1);
  EXPECT_EQ(plan.buffers(0).id(), m.y);
  EXPECT_FALSE(plan.buffers(0).in_arena());
  EXPECT_EQ(plan.arena_bytes(), 0u);
  ASSERT_EQ(plan.size_symbols_size(), 1);
  EXPECT_EQ(plan.size_symbols(0).SerializeAsString(),
            m.request.graph().size_symbols(0).SerializeAsString());
  bool found = false;
  for (const auto& v : plan.values()) {
    if (v.id() != m.z) continue;
    found = true;
    ASSERT_EQ(v.meta().size_exprs_size(), 1);
    EXPECT_EQ(v.meta().size_exprs(0).SerializeAsString(), Term(8, {0}).SerializeAsString());
    EXPECT_EQ(v.meta().sizes(0), -1);
  }
  EXPECT_TRUE(found);
  // The generators see the group over [representative s0, 8] with s0 at run time.
  ASSERT_EQ(planned.program.groups.size(), 1u);
  const FusedGroup& g = planned.program.groups[0];
  ASSERT_TRUE(g.runtime_outer.has_value());
  EXPECT_EQ(g.runtime_outer->SerializeAsString(), Term(1, {0}).SerializeAsString());
  EXPECT_EQ(g.sizes.size(), 2u);
  EXPECT_EQ(g.sizes[1], 8);
}

// x [s0, s1, 8] per call, b [s1, 8] per call: out = x + b over [s0, s1, 8]; with `mean`, also
// mean(x, dim=-1 or 2, keepdim) over the rows.
kiln::v1::CompileRequest TwoSymbols(bool broadcast_b, bool mean, int64_t dim = -1) {
  GraphBuilder b;
  const uint32_t x = b.Input({3, 5, 8});
  const uint32_t y = b.Input(broadcast_b ? std::vector<int64_t>{5, 8} : std::vector<int64_t>{3, 5, 8});
  const uint32_t sum = b.Op("aten::add.Tensor", {V(x), V(y)}, {3, 5, 8});
  b.Output(sum);
  uint32_t rows = 0;
  if (mean) {
    rows = b.Op("aten::mean.dim", {V(sum), Ints({dim}), B(true)}, {3, 5, 1});
    b.Output(rows);
  }
  kiln::v1::CompileRequest request = b.Request();
  kiln::v1::Graph* g = request.mutable_graph();
  SetSymbolic(g->mutable_inputs(0)->mutable_meta(), {Term(1, {0}), Term(1, {1}), Term(8)});
  if (broadcast_b) {
    SetSymbolic(g->mutable_inputs(1)->mutable_meta(), {Term(1, {1}), Term(8)});
  } else {
    SetSymbolic(g->mutable_inputs(1)->mutable_meta(), {Term(1, {0}), Term(1, {1}), Term(8)});
  }
  SetSymbolic(g->mutable_nodes(0)->mutable_outputs(0)->mutable_meta(),
              {Term(1, {0}), Term(1, {1}), Term(8)});
  if (mean) {
    SetSymbolic(g->mutable_nodes(1)->mutable_outputs(0)->mutable_meta(),
                {Term(1, {0}), Term(1, {1}), Term(1)});
  }
  AddSizeSymbols(g, x, 2, 2);
  return request;
}

TEST(SymbolicGraph, SymbolicDimsMergeIntoOneExtentWhenEveryAccessWalksThemAsOne) {
  const kiln::v1::CompileRequest request = TwoSymbols(false, false);
  ASSERT_EQ(Problem(request), "");
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  ASSERT_TRUE(planned.has_kernels);
  const kiln::v1::KernelLaunch& k = planned.body.plan().steps(0).kernel();
  ASSERT_EQ(k.size_args_size(), 1);
  EXPECT_EQ(k.size_args(0).SerializeAsString(), Term(1, {0, 1}).SerializeAsString());
  const FusedGroup& g = planned.program.groups[0];
  EXPECT_EQ(g.sizes.size(), 2u);  // [s0 * s1, 8]
  for (const KernelOperand& in : g.inputs) EXPECT_EQ(in.strides, (std::vector<int64_t>{8, 1}));
}

TEST(SymbolicGraph, AnOperandBroadcastOverPartOfTheSymbolicDimsKeepsTheNodeALibraryCall) {
  // b [s1, 8] broadcast over s0 only: no static stride walks [s0, s1] as one extent.
  const kiln::v1::CompileRequest request = TwoSymbols(true, false);
  ASSERT_EQ(Problem(request), "");
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  EXPECT_FALSE(planned.has_kernels);
  ASSERT_EQ(planned.body.plan().steps_size(), 1);
  EXPECT_EQ(planned.body.plan().steps(0).library().op(), "aten::add.Tensor");
}

TEST(SymbolicGraph, TheNodeThatFailsTheChecksIsALibraryCallAndTheRestOfItsGroupAKernel) {
  // The add reads b [s1, 8] broadcast over s0 only; the mean of its result still merges.
  const kiln::v1::CompileRequest request = TwoSymbols(true, true);
  ASSERT_EQ(Problem(request), "");
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  ASSERT_TRUE(planned.has_kernels);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_EQ(plan.steps_size(), 2);
  EXPECT_EQ(plan.steps(0).library().op(), "aten::add.Tensor");
  ASSERT_TRUE(plan.steps(1).has_kernel());
  ASSERT_EQ(planned.program.groups.size(), 1u);
  EXPECT_EQ(planned.program.groups[0].outer_rank, 1);
}

TEST(SymbolicGraph, ARowReductionOverSymbolicRowsIsAKernelWithItsDimsCountedFromTheEnd) {
  for (int64_t dim : {-1, 2}) {
    const kiln::v1::CompileRequest request = TwoSymbols(false, true, dim);
    ASSERT_EQ(Problem(request), "");
    PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
    ASSERT_TRUE(planned.has_kernels);
    ASSERT_EQ(planned.program.groups.size(), 1u) << dim;
    const FusedGroup& g = planned.program.groups[0];
    EXPECT_EQ(g.outer_rank, 1);
    EXPECT_EQ(g.sizes.size(), 2u);
    ASSERT_TRUE(g.runtime_outer.has_value());
    EXPECT_EQ(g.runtime_outer->SerializeAsString(), Term(1, {0, 1}).SerializeAsString());
    // The kernels' graph: the mean reads [rows, 8] and reduces dim -1.
    const kiln::v1::Node& mean = planned.graph->nodes(1);
    EXPECT_EQ(mean.args(1).int_list().values(0), -1);
    EXPECT_EQ(mean.outputs(0).meta().sizes_size(), 2);
  }
}

// `a` + `b`, two single terms in canonical order (a's symbols before b's).
SymExpr Plus(SymExpr a, const SymExpr& b) {
  *a.add_terms() = b.terms(0);
  return a;
}

// x [s0, 8] per call -> last = x[s0 - 1:] ([1, 8] at storage offset 8 * s0 - 8) -> relu(last).
kiln::v1::CompileRequest LastRow() {
  GraphBuilder b;
  const uint32_t x = b.Input({67, 8});
  kiln::v1::Argument start, end;
  *start.mutable_sym_int_value() = Plus(Term(-1), Term(1, {0}));
  *end.mutable_sym_int_value() = Term(1, {0});
  const uint32_t last = b.Op("aten::slice.Tensor", {V(x), kiln::testing::I(0), start, end,
                                                    kiln::testing::I(1)}, {1, 8});
  const uint32_t out = b.Op("aten::relu", {V(last)}, {1, 8});
  b.Output(out);
  kiln::v1::CompileRequest request = b.Request();
  kiln::v1::Graph* g = request.mutable_graph();
  SetSymbolic(g->mutable_inputs(0)->mutable_meta(), {Term(1, {0}), Term(8)});
  kiln::v1::TensorMeta* view = g->mutable_nodes(0)->mutable_outputs(0)->mutable_meta();
  SetSymbolic(view, {Term(1), Term(8)});
  *view->mutable_storage_offset_expr() = Plus(Term(-8), Term(8, {0}));
  AddSizeSymbols(g, x, 1, 2);
  return request;
}

TEST(SymbolicGraph, AStorageOffsetExpressionIsCanonicalNotConstantAndAloneInItsMeta) {
  EXPECT_EQ(Problem(LastRow()), "");
  kiln::v1::CompileRequest constant = LastRow();
  auto* view = constant.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta();
  *view->mutable_storage_offset_expr() = Term(8);
  EXPECT_NE(Problem(constant).find("a constant storage offset"), std::string::npos);
  kiln::v1::CompileRequest both = LastRow();
  both.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->set_storage_offset(8);
  EXPECT_NE(Problem(both).find("disagrees with its expression"), std::string::npos);
  kiln::v1::CompileRequest unknown = LastRow();
  *unknown.mutable_graph()->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()
       ->mutable_storage_offset_expr() = Term(8, {3});
  EXPECT_NE(Problem(unknown).find("storage offset expression"), std::string::npos);
}

TEST(SymbolicGraph, AViewAtASymbolicOffsetIsReadAsTheViewNotFoldedAtTheRepresentativeOffset) {
  const kiln::v1::CompileRequest request = LastRow();
  ASSERT_EQ(Problem(request), "");
  PlannedGraph planned = PlanGraph(request, kiln::v1::DEVICE_KIND_CPU);
  // A kernel folding the slice would read x at the representative sizes' offset (8 * 67 - 8)
  // whatever s0 is: the relu reads the view the library step makes instead.
  for (const FusedGroup& g : planned.program.groups) {
    for (const KernelOperand& in : g.inputs) EXPECT_EQ(in.offset, 0);
  }
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_GE(plan.steps_size(), 1);
  EXPECT_EQ(plan.steps(0).library().op(), "aten::slice.Tensor");
  bool found = false;
  for (const auto& v : plan.values()) {
    if (!v.meta().has_storage_offset_expr()) continue;
    found = true;
    EXPECT_EQ(v.meta().storage_offset(), 0);
    EXPECT_EQ(ConstantOf(v.meta().storage_offset_expr()), std::nullopt);
  }
  EXPECT_TRUE(found);  // the plan evaluates the view's offset per call
}

TEST(SymExpr, ProductsAndEvaluationKeepTheCanonicalForm) {
  SymExpr a = Term(2, {0});
  auto* t = a.add_terms();
  t->set_coefficient(3);
  t->add_symbols(1);
  const std::optional<SymExpr> square = SymProduct(a, a);  // 4 s0^2 + 12 s0 s1 + 9 s1^2
  ASSERT_TRUE(square.has_value());
  EXPECT_EQ(SymExprProblem(*square, {0, 1}), "");
  ASSERT_EQ(square->terms_size(), 3);
  EXPECT_EQ(square->terms(1).coefficient(), 12);
  EXPECT_TRUE(SymEqual(*SymProduct(Term(1, {1}), Term(1, {0})), Term(1, {0, 1})));
  EXPECT_FALSE(SymEqual(Term(1, {0}), Term(1, {1})));
  EXPECT_EQ(SymEvaluate(*square, {{0, 2}, {1, 1}}), 16 + 24 + 9);
  EXPECT_FALSE(SymEvaluate(*square, {{0, 2}}).has_value());
  EXPECT_FALSE(SymEvaluate(Term(1, {0, 0}), {{0, int64_t{1} << 40}}).has_value());
  EXPECT_FALSE(SymProduct(Term(INT64_MAX, {0}), Term(2)).has_value());
  EXPECT_EQ(SymConstant(0).terms_size(), 0);
}

TEST(SymExpr, ConstantsAndSingleSymbolsAreRecognised) {
  EXPECT_EQ(ConstantOf(Term(0)), 0);
  EXPECT_EQ(ConstantOf(Term(7)), 7);
  EXPECT_FALSE(ConstantOf(Term(7, {0})).has_value());
  uint32_t s = 99;
  EXPECT_TRUE(IsSymbol(Term(1, {3}), &s));
  EXPECT_EQ(s, 3u);
  EXPECT_FALSE(IsSymbol(Term(2, {3}), &s));
  EXPECT_FALSE(IsSymbol(Term(1, {3, 3}), &s));
}

}  // namespace
}  // namespace kiln::compiler
