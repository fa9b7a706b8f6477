// AccumulateResidualsInPlace: a convolution's residual add writes into the residual's memory
// only where no one can see the residual overwritten, and the buffer plan keeps that memory
// alive through the result.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/bound_prologue.h"
#include "compiler/cpu_compiler.h"
#include "compiler/fusion.h"
#include "compiler/graph_passes.h"
#include "compiler/memory_plan.h"
#include "compiler/onednn_passes.h"
#include "tests/cpp/support/graph_builder.h"

namespace kiln::compiler {
namespace {

using kiln::testing::B;
using kiln::testing::GraphBuilder;
using kiln::testing::I;
using kiln::testing::Ints;
using kiln::testing::kF32;
using kiln::testing::None;
using kiln::testing::V;
using kiln::v1::Graph;

const std::vector<int64_t> kSizes{1, 4, 6, 6};
const std::vector<int64_t> kNhwc{144, 1, 24, 4};

// A residual block, channels last: y = relu(conv2(relu(conv1(x))) + r).
struct Block {
  GraphBuilder b;
  uint32_t x, r, out;
  uint32_t Conv(uint32_t in, uint32_t w, int64_t pad) {
    return b.Op("aten::convolution",
                {V(in), V(w), None(), Ints({1, 1}), Ints({pad, pad}), Ints({1, 1}), B(false),
                 Ints({0, 0}), I(1)},
                kSizes, kF32, kNhwc);
  }
  Graph Passes() const {
    Graph g = EliminateDeadCode(UseOneDnnConvolution(b.graph()));
    return AccumulateResidualsInPlace(g, &stats);
  }
  mutable PassStats stats;
};

// The block with a 1x1 projection as the residual; `reader_after` reads it again after the
// sum, `residual_is_output` returns it.
Block Projection(bool reader_after, bool residual_is_output) {
  Block k;
  uint32_t w1 = k.b.Input({4, 4, 3, 3}), w2 = k.b.Input({4, 4, 3, 3}), w3 = k.b.Input({4, 4, 1, 1});
  k.b.Bound(3);
  k.x = k.b.Input(kSizes, kF32, kNhwc);
  uint32_t r1 = k.b.Op("aten::relu", {V(k.Conv(k.x, w1, 1))}, kSizes, kF32, kNhwc);
  uint32_t c2 = k.Conv(r1, w2, 1);
  k.r = k.Conv(k.x, w3, 0);  // after the main path, as torchvision's Bottleneck computes it
  uint32_t sum = k.b.Op("aten::add.Tensor", {V(c2), V(k.r)}, kSizes, kF32, kNhwc);
  k.out = k.b.Op("aten::relu", {V(sum)}, kSizes, kF32, kNhwc);
  if (reader_after) {
    k.out = k.b.Op("aten::mul.Tensor", {V(k.out), V(k.r)}, kSizes, kF32, kNhwc);
  }
  k.b.Output(k.out);
  if (residual_is_output) k.b.Output(k.r);
  return k;
}

int Count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op() == op ? 1 : 0;
  return n;
}

TEST(InPlaceResidualTest, AProjectionReadOnlyByTheSumIsAccumulatedInto) {
  Block k = Projection(false, false);
  Graph g = k.Passes();
  EXPECT_EQ(k.stats.inplace_residuals, 1);
  EXPECT_EQ(Count(g, "mkldnn::_convolution_pointwise.binary"), 0);
  ASSERT_EQ(Count(g, "mkldnn::_convolution_pointwise_.binary"), 1);
  for (const auto& n : g.nodes()) {
    if (n.op() != "mkldnn::_convolution_pointwise_.binary") continue;
    EXPECT_EQ(n.args(0).value(), k.r);  // the residual comes first: it is written
    EXPECT_EQ(n.args(8).string_value(), "add");
    EXPECT_EQ(n.args(10).string_value(), "relu");
    EXPECT_EQ(n.outputs(0).id(), k.out);
  }
}

TEST(InPlaceResidualTest, AResidualReadAfterTheSumIsNotOverwritten) {
  Block k = Projection(true, false);
  Graph g = k.Passes();
  EXPECT_EQ(k.stats.inplace_residuals, 0);
  EXPECT_EQ(Count(g, "mkldnn::_convolution_pointwise.binary"), 1);
}

TEST(InPlaceResidualTest, AResidualTheCallerGetsBackIsNotOverwritten) {
  Block k = Projection(false, true);
  Graph g = k.Passes();
  EXPECT_EQ(k.stats.inplace_residuals, 0);
  EXPECT_EQ(Count(g, "mkldnn::_convolution_pointwise.binary"), 1);
}

TEST(InPlaceResidualTest, TheCallersInputIsNeverTheResidualWrittenInto) {
  // y = relu(conv2(relu(conv1(x))) + x): x is read by conv1 first (an ancestor), but it is the
  // caller's tensor.
  Block k;
  uint32_t w1 = k.b.Input({4, 4, 3, 3}), w2 = k.b.Input({4, 4, 3, 3});
  k.b.Bound(2);
  k.x = k.b.Input(kSizes, kF32, kNhwc);
  uint32_t r1 = k.b.Op("aten::relu", {V(k.Conv(k.x, w1, 1))}, kSizes, kF32, kNhwc);
  uint32_t sum = k.b.Op("aten::add.Tensor", {V(k.Conv(r1, w2, 1)), V(k.x)}, kSizes, kF32, kNhwc);
  k.b.Output(k.b.Op("aten::relu", {V(sum)}, kSizes, kF32, kNhwc));
  Graph g = k.Passes();
  EXPECT_EQ(Count(g, "mkldnn::_convolution_pointwise.binary"), 1);
  EXPECT_EQ(k.stats.inplace_residuals, 0);
}

TEST(InPlaceResidualTest, AnEarlierReaderThatTheConvolutionDependsOnIsAllowed) {
  // Two blocks: the first block's output r feeds the second block's conv1 and its sum. conv1
  // reads r before the sum (the sum depends on it): r may be overwritten.
  Block k;
  uint32_t w[5];
  for (int i = 0; i < 5; ++i) w[i] = k.b.Input({4, 4, i == 0 ? 1 : 3, i == 0 ? 1 : 3});
  k.b.Bound(5);
  k.x = k.b.Input(kSizes, kF32, kNhwc);
  uint32_t proj = k.Conv(k.x, w[0], 0);
  uint32_t a1 = k.b.Op("aten::relu", {V(k.Conv(k.x, w[1], 1))}, kSizes, kF32, kNhwc);
  uint32_t s1 = k.b.Op("aten::add.Tensor", {V(k.Conv(a1, w[2], 1)), V(proj)}, kSizes, kF32, kNhwc);
  uint32_t r = k.b.Op("aten::relu", {V(s1)}, kSizes, kF32, kNhwc);
  uint32_t a2 = k.b.Op("aten::relu", {V(k.Conv(r, w[3], 1))}, kSizes, kF32, kNhwc);
  uint32_t s2 = k.b.Op("aten::add.Tensor", {V(k.Conv(a2, w[4], 1)), V(r)}, kSizes, kF32, kNhwc);
  k.b.Output(k.b.Op("aten::relu", {V(s2)}, kSizes, kF32, kNhwc));
  Graph g = k.Passes();
  EXPECT_EQ(k.stats.inplace_residuals, 2);  // the projection, then the first block's output
  EXPECT_EQ(Count(g, "mkldnn::_convolution_pointwise_.binary"), 2);
}

TEST(InPlaceResidualTest, AResidualWithAViewReaderIsNotOverwritten) {
  Block k = Projection(false, false);
  // Another output: a view of the residual, taken before the sum.
  Graph g = k.b.graph();
  kiln::v1::Node* view = g.add_nodes();
  view->set_op("aten::alias");
  view->add_args()->set_value(k.r);
  kiln::v1::Value* v = view->add_outputs();
  v->set_id(1000);
  *v->mutable_meta() = g.nodes(0).outputs(0).meta();
  g.add_outputs(1000);
  PassStats stats;
  AccumulateResidualsInPlace(EliminateDeadCode(UseOneDnnConvolution(g)), &stats);
  EXPECT_EQ(stats.inplace_residuals, 0);
}

TEST(InPlaceResidualTest, TheResidualStaysOutOfTheArenaWhileTheResultLives) {
  // The residual made by a kernel (x * 2) is written in place: its memory becomes the result's,
  // so the arena must not hand it to a later buffer.
  Block k;
  uint32_t w1 = k.b.Input({4, 4, 3, 3}), w2 = k.b.Input({4, 4, 3, 3});
  k.b.Bound(2);
  k.x = k.b.Input(kSizes, kF32, kNhwc);
  k.r = k.b.Op("aten::mul.Tensor", {V(k.x), kiln::testing::F(2.0)}, kSizes, kF32, kNhwc);
  uint32_t r1 = k.b.Op("aten::relu", {V(k.Conv(k.x, w1, 1))}, kSizes, kF32, kNhwc);
  uint32_t sum = k.b.Op("aten::add.Tensor", {V(k.Conv(r1, w2, 1)), V(k.r)}, kSizes, kF32, kNhwc);
  uint32_t y = k.b.Op("aten::relu", {V(sum)}, kSizes, kF32, kNhwc);
  k.b.Output(k.b.Op("aten::neg", {V(y)}, kSizes, kF32, kNhwc));
  Graph g = k.Passes();
  ASSERT_EQ(k.stats.inplace_residuals, 1);
  const auto bound = BoundValues(g);
  g = BoundNodesFirst(g, bound);
  FusedProgram program = FuseGraph(g, &bound);
  kiln::v1::ExecutionPlan plan = BuildPlan(g, program, &bound);
  bool found = false;
  for (const auto& buffer : plan.buffers()) {
    if (buffer.id() != k.r) continue;
    found = true;
    EXPECT_FALSE(buffer.in_arena());
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kiln::compiler
