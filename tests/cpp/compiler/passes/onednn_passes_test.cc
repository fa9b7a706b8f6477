// The oneDNN rewrites that come after library-op selection. AccumulateResidualsInPlace: a
// convolution's residual add writes into the residual's memory only where no one can see the
// residual overwritten, and the buffer plan keeps that memory alive through the result.
// FuseLinearEpilogues: a linear's bias add and its relu become the oneDNN call's bias and post-op,
// through the reshape of a 3-D linear, and only when nothing else reads what they absorb.
// UseOneDnnConvolution: a folded weight only its convolution reads is written channels-last.
#include "compiler/passes/onednn_passes.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/cpu_compiler.h"
#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/fusion.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/memory_plan.h"
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

// A conv-BN fold (weight * per-channel scale) feeding one convolution: its result is written
// channels-last, the layout the weight reorder packs from without copying; a fold someone else
// reads, and a weight that is a bound input, keep their layout.
struct FoldedWeight {
  Block k;
  uint32_t folded;
  explicit FoldedWeight(bool folded_is_output) {
    uint32_t w = k.b.Input({4, 4, 3, 3}), scale = k.b.Input({4, 1, 1, 1});
    k.b.Bound(2);
    k.x = k.b.Input(kSizes, kF32, kNhwc);
    folded = k.b.Op("aten::mul.Tensor", {V(w), V(scale)}, {4, 4, 3, 3}, kF32, {36, 9, 3, 1});
    k.out = k.Conv(k.x, folded, 1);
    k.b.Output(k.out);
    if (folded_is_output) k.b.Output(folded);
  }
  Graph Pass() const { return UseOneDnnConvolution(k.b.graph(), &stats); }
  std::vector<int64_t> FoldStrides(const Graph& g) const {
    for (const auto& n : g.nodes()) {
      for (const auto& o : n.outputs()) {
        if (o.id() == folded) return {o.meta().strides().begin(), o.meta().strides().end()};
      }
    }
    return {};
  }
  mutable PassStats stats;
};

TEST(ConvolutionWeightLayoutTest, AFoldedWeightOnlyTheConvolutionReadsIsWrittenChannelsLast) {
  FoldedWeight f(false);
  Graph g = f.Pass();
  EXPECT_EQ(f.stats.channels_last_weights, 1);
  EXPECT_EQ(f.FoldStrides(g), (std::vector<int64_t>{36, 1, 12, 4}));
  ASSERT_EQ(Count(g, "mkldnn::_reorder_convolution_weight"), 1);
  for (const auto& n : g.nodes()) {
    if (n.op() == "mkldnn::_reorder_convolution_weight") {
      EXPECT_EQ(n.args(0).value(), f.folded);
    }
  }
}

TEST(ConvolutionWeightLayoutTest, AFoldedWeightTheCallerGetsBackKeepsItsLayout) {
  FoldedWeight f(true);
  Graph g = f.Pass();
  EXPECT_EQ(f.stats.channels_last_weights, 0);
  EXPECT_EQ(f.FoldStrides(g), (std::vector<int64_t>{36, 9, 3, 1}));
}

TEST(ConvolutionWeightLayoutTest, ABoundInputWeightIsLeftAsItIs) {
  Block k = Projection(false, false);
  PassStats stats;
  UseOneDnnConvolution(k.b.graph(), &stats);
  EXPECT_EQ(stats.onednn_convolutions, 3);
  EXPECT_EQ(stats.channels_last_weights, 0);
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

// x [B*T, K] -> linear -> view [B, T, N] -> + bias -> activation: a 3-D nn.Linear and its
// activation as lowered (a gelu decomposed: here one node, which the pass leaves alone too).
struct LinearGelu {
  GraphBuilder b;
  uint32_t w, bias, x, lin, view, sum, act;
  LinearGelu(const std::string& activation, bool view_first = true) {
    w = b.Input({8, 16});
    bias = b.Input({8});
    b.Bound(2);
    x = b.Input({6, 16});
    lin = b.Op("mkldnn::_linear_pointwise", {V(x), V(w), None(), Str("none"), Ints({}), None()},
               {6, 8});
    view = view_first ? b.Op("aten::view", {V(lin), Ints({2, 3, 8})}, {2, 3, 8}) : lin;
    const std::vector<int64_t> sizes =
        view_first ? std::vector<int64_t>{2, 3, 8} : std::vector<int64_t>{6, 8};
    sum = b.Op("aten::add.Tensor", {V(view), V(bias)}, sizes);
    act = sum;
    if (activation == "gelu") act = b.Op("aten::gelu", {V(sum)}, sizes);
    if (activation == "gelu-tanh") act = b.Op("aten::gelu", {V(sum), Str("tanh")}, sizes);
    if (activation == "relu") act = b.Op("aten::relu", {V(sum)}, sizes);
    if (activation == "sigmoid") act = b.Op("aten::sigmoid", {V(sum)}, sizes);
  }
  static kiln::v1::Argument Str(const std::string& s) {
    kiln::v1::Argument a;
    a.set_string_value(s);
    return a;
  }
};

TEST(LinearEpilogueTest, BiasAndReluOfAViewedProductBecomeTheLinearsBiasAndPostOp) {
  LinearGelu k("relu");
  k.b.Output(k.act);
  PassStats stats;
  Graph g = FuseLinearEpilogues(k.b.graph(), &stats);
  EXPECT_EQ(stats.linear_biases, 1);
  EXPECT_EQ(stats.fused_post_ops, 1);
  ASSERT_EQ(g.nodes_size(), 2);
  const auto& lin = g.nodes(0);
  EXPECT_EQ(lin.op(), "mkldnn::_linear_pointwise");
  EXPECT_EQ(lin.args(2).value(), k.bias);
  EXPECT_EQ(lin.args(3).string_value(), "relu");
  EXPECT_EQ(lin.outputs(0).meta().sizes_size(), 2);  // the GEMM's [B*T, N]
  const auto& view = g.nodes(1);
  EXPECT_EQ(view.op(), "aten::view");
  EXPECT_EQ(view.args(0).value(), lin.outputs(0).id());
  EXPECT_EQ(view.outputs(0).id(), k.act);  // what readers of the relu read
}

TEST(LinearEpilogueTest, ABiasAloneIsFusedWithoutAView) {
  LinearGelu k("none", /*view_first=*/false);
  k.b.Output(k.act);
  Graph g = FuseLinearEpilogues(k.b.graph());
  ASSERT_EQ(g.nodes_size(), 1);
  EXPECT_EQ(g.nodes(0).outputs(0).id(), k.act);
  EXPECT_EQ(g.nodes(0).args(2).value(), k.bias);
  EXPECT_EQ(g.nodes(0).args(3).string_value(), "none");
}

TEST(LinearEpilogueTest, GeluAndOtherActivationsStayKernelsAfterTheFusedBias) {
  for (const std::string act : {"gelu", "gelu-tanh", "sigmoid"}) {
    LinearGelu k(act);
    k.b.Output(k.act);
    Graph g = FuseLinearEpilogues(k.b.graph());
    std::vector<std::string> ops;
    for (const auto& n : g.nodes()) ops.push_back(n.op());
    const std::string kernel_op = act == "sigmoid" ? "aten::sigmoid" : "aten::gelu";
    EXPECT_EQ(ops, (std::vector<std::string>{"mkldnn::_linear_pointwise", "aten::view", kernel_op}))
        << act;
    EXPECT_EQ(g.nodes(0).args(3).string_value(), "none") << act;
    EXPECT_EQ(g.nodes(0).args(2).value(), k.bias) << act;
    EXPECT_EQ(g.nodes(1).outputs(0).id(), k.sum) << act;  // the activation reads the sum's id
  }
}

TEST(LinearEpilogueTest, NothingIsAbsorbedThatAnotherNodeOrTheCallerReads) {
  {  // the product itself is returned
    LinearGelu k("gelu");
    k.b.Output(k.act);
    k.b.Output(k.lin);
    PassStats stats;
    FuseLinearEpilogues(k.b.graph(), &stats);
    EXPECT_EQ(stats.linear_biases, 0);
  }
  {  // the sum is read twice: bias fused, the relu not
    LinearGelu k("relu");
    uint32_t other = k.b.Op("aten::neg", {V(k.sum)}, {2, 3, 8});
    k.b.Output(k.act);
    k.b.Output(other);
    PassStats stats;
    Graph g = FuseLinearEpilogues(k.b.graph(), &stats);
    EXPECT_EQ(stats.linear_biases, 1);
    EXPECT_EQ(stats.fused_post_ops, 0);
    EXPECT_EQ(Count(g, "aten::relu"), 1);
  }
  {  // the "bias" is a per-call input, not a parameter
    GraphBuilder b;
    uint32_t w = b.Input({8, 16});
    b.Bound(1);
    uint32_t x = b.Input({6, 16}), not_bound = b.Input({8});
    uint32_t lin = b.Op("mkldnn::_linear_pointwise",
                        {V(x), V(w), None(), LinearGelu::Str("none"), Ints({}), None()}, {6, 8});
    b.Output(b.Op("aten::add.Tensor", {V(lin), V(not_bound)}, {6, 8}));
    PassStats stats;
    FuseLinearEpilogues(b.graph(), &stats);
    EXPECT_EQ(stats.linear_biases, 0);
  }
  {  // a bias broadcast along rows ([6, 1]) is no linear bias
    GraphBuilder b;
    uint32_t w = b.Input({8, 16}), rows = b.Input({6, 1});
    b.Bound(2);
    uint32_t x = b.Input({6, 16});
    uint32_t lin = b.Op("mkldnn::_linear_pointwise",
                        {V(x), V(w), None(), LinearGelu::Str("none"), Ints({}), None()}, {6, 8});
    b.Output(b.Op("aten::add.Tensor", {V(lin), V(rows)}, {6, 8}));
    PassStats stats;
    FuseLinearEpilogues(b.graph(), &stats);
    EXPECT_EQ(stats.linear_biases, 0);
  }
}

}  // namespace
}  // namespace kiln::compiler
