// Graphs with size symbols: what validation accepts and refuses of their expressions and
// bindings, and the plan the pipeline makes of them (library steps whose values keep their
// expressions, the symbols passed on for the runtime to bind per call).
#include <gtest/gtest.h>

#include "compiler/ir/ir_validator.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/passes/plan_pipeline.h"
#include "tests/cpp/support/graph_builder.h"

namespace kiln::compiler {
namespace {

using kiln::testing::GraphBuilder;
using kiln::testing::V;
using kiln::v1::SymExpr;

// c * symbols..., one term (c 0: no terms).
SymExpr Term(int64_t c, std::vector<uint32_t> symbols = {}) {
  SymExpr e;
  if (c == 0) return e;
  auto* t = e.add_terms();
  t->set_coefficient(c);
  for (uint32_t s : symbols) t->add_symbols(s);
  return e;
}

// Sets value meta `m` to sizes `exprs` with row-major strides over them (products of the
// sizes after each dim: single terms here, so the product of terms is one term).
void SetSymbolic(kiln::v1::TensorMeta* m, const std::vector<SymExpr>& exprs) {
  m->clear_sizes();
  m->clear_strides();
  m->clear_size_exprs();
  m->clear_stride_exprs();
  std::vector<SymExpr> strides(exprs.size());
  SymExpr stride = Term(1);
  for (int d = static_cast<int>(exprs.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    const auto& a = stride.terms(0);
    const auto& b = exprs[d].terms(0);
    std::vector<uint32_t> symbols(a.symbols().begin(), a.symbols().end());
    symbols.insert(symbols.end(), b.symbols().begin(), b.symbols().end());
    std::sort(symbols.begin(), symbols.end());
    stride = Term(a.coefficient() * b.coefficient(), symbols);
  }
  for (size_t d = 0; d < exprs.size(); ++d) {
    *m->add_size_exprs() = exprs[d];
    *m->add_stride_exprs() = strides[d];
    const auto size = ConstantOf(exprs[d]);
    const auto step = ConstantOf(strides[d]);
    m->add_sizes(size ? *size : -1);
    m->add_strides(step ? *step : 0);
  }
}

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

TEST(SymbolicGraph, ExpressionsNeedSymbolsAndSymbolsForbidInputUpdates) {
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
  auto updates = m.request;
  updates.mutable_graph()->add_input_updates()->set_input(m.x);
  updates.mutable_graph()->mutable_input_updates(0)->set_value(m.r);
  EXPECT_NE(Problem(updates).find("updates an input"), std::string::npos) << Problem(updates);
}

TEST(SymbolicGraph, ThePlanRunsEveryNodeAsALibraryCallOverTheExpressions) {
  Mlp m;
  ASSERT_EQ(Problem(m.request), "");
  PlannedGraph planned = PlanGraph(m.request, kiln::v1::DEVICE_KIND_CPU);
  EXPECT_FALSE(planned.has_kernels);
  const kiln::v1::ExecutionPlan& plan = planned.body.plan();
  ASSERT_EQ(plan.steps_size(), 3);
  EXPECT_EQ(plan.steps(0).library().op(), "aten::relu");
  EXPECT_EQ(plan.steps(1).library().op(), "aten::mul.Tensor");
  EXPECT_EQ(plan.steps(2).library().op(), "aten::view");
  EXPECT_EQ(plan.steps(2).library().args(1).sym_int_list().SerializeAsString(),
            m.request.graph().nodes(2).args(1).sym_int_list().SerializeAsString());
  EXPECT_EQ(plan.buffers_size(), 0);
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
