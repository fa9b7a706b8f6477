// The graph snapshots a compile records after each pass (ArtifactBody.pass_snapshots): their
// order, what they hold, and that recording them changes nothing the passes compute.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/cpu_compiler.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/pass_log.h"
#include "tests/cpp/support/graph_builder.h"

namespace kiln::compiler {
namespace {

using kiln::testing::ConvBn;
using kiln::testing::F;
using kiln::testing::GraphBuilder;
using kiln::testing::kF32;
using kiln::testing::V;
using kiln::v1::ArtifactBody;
using kiln::v1::Graph;
using kiln::v1::PassSnapshot;
using kiln::v1::PassSnapshots;

std::vector<std::string> Names(const PassSnapshots& snapshots) {
  std::vector<std::string> names;
  for (const PassSnapshot& s : snapshots.passes()) names.push_back(s.name());
  return names;
}

// The graph as the pass at `index` left it: its own, or the latest changed one before it.
const Graph& GraphAfter(const PassSnapshots& snapshots, int index) {
  while (snapshots.passes(index).unchanged()) --index;
  return snapshots.passes(index).graph();
}

int IndexOf(const PassSnapshots& snapshots, const std::string& name) {
  for (int i = 0; i < snapshots.passes_size(); ++i) {
    if (snapshots.passes(i).name() == name) return i;
  }
  return -1;
}

// The ops that compute on the activation ([2, 4, 8, 8]) rather than on parameters: the
// convolution, and the batch norm's per-call chain until folding moves it into the weights.
std::vector<std::string> ActivationOps(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) {
    const auto& sizes = n.outputs(0).meta().sizes();
    if (std::vector<int64_t>(sizes.begin(), sizes.end()) == std::vector<int64_t>{2, 4, 8, 8}) {
      ops.push_back(n.op());
    }
  }
  return ops;
}

// The compile's artifact and the snapshots it carries.
struct Compiled {
  ArtifactBody body;
  PassSnapshots snapshots;
};

Compiled CompileConvBn(const ConvBn& cb, bool onednn) {
  kiln::v1::CompileRequest request = cb.b.Request();
  request.mutable_target()->set_cpu_onednn(onednn);
  CpuCompiler compiler;
  auto body = compiler.Compile(request);
  EXPECT_TRUE(body.ok()) << body.status();
  if (!body.ok()) return {};
  auto snapshots = ReadPassSnapshots(body->pass_snapshots());
  EXPECT_TRUE(snapshots.ok()) << snapshots.status();
  return {*std::move(body), snapshots.ok() ? *std::move(snapshots) : PassSnapshots()};
}

// The hoisting loop runs one to four rounds of "hoist views above pointwise" then "dead code".
void ExpectPipelineOrder(const std::vector<std::string>& names,
                         const std::vector<std::string>& tail) {
  ASSERT_GE(names.size(), 5 + tail.size());
  EXPECT_EQ(names[0], "received");
  EXPECT_EQ(names[1], "batch norm decomposed");
  EXPECT_EQ(names[2], "simplify views");
  size_t i = 3;
  int rounds = 0;
  while (i + 1 < names.size() && names[i] == "hoist views above pointwise") {
    EXPECT_EQ(names[i + 1], "dead code");
    i += 2;
    ++rounds;
  }
  EXPECT_GE(rounds, 1);
  EXPECT_LE(rounds, 4);
  EXPECT_EQ(std::vector<std::string>(names.begin() + i, names.end()), tail);
}

TEST(PassSnapshotTest, CompileRecordsEveryPassInPipelineOrder) {
  ConvBn cb;
  Compiled c = CompileConvBn(cb, /*onednn=*/false);
  ExpectPipelineOrder(Names(c.snapshots),
                      {"common subexpressions", "dead code", "fold convolution affine", "dead code",
                       "bound nodes first"});
  // The graph as received is the request's, less its constants' data.
  ASSERT_GT(c.snapshots.passes_size(), 0);
  EXPECT_EQ(c.snapshots.passes(0).graph().SerializeAsString(), cb.b.graph().SerializeAsString());
}

TEST(PassSnapshotTest, OneDnnPassesAreRecordedAfterFolding) {
  ConvBn cb;
  Compiled c = CompileConvBn(cb, /*onednn=*/true);
  ExpectPipelineOrder(Names(c.snapshots),
                      {"common subexpressions", "dead code", "fold convolution affine", "dead code",
                       "oneDNN convolution", "oneDNN linear", "oneDNN linear epilogues", "dead code",
                       "in-place residuals",
                       "bound nodes first"});
  const int onednn = IndexOf(c.snapshots, "oneDNN convolution");
  ASSERT_GT(onednn, 0);
  bool fused = false;
  for (const auto& n : GraphAfter(c.snapshots, onednn).nodes()) {
    fused = fused || n.op().starts_with("mkldnn::_convolution_pointwise");
  }
  EXPECT_TRUE(fused);
}

TEST(PassSnapshotTest, BatchNormChainIsInTheSnapshotBeforeFoldingAndGoneAfter) {
  ConvBn cb;
  Compiled c = CompileConvBn(cb, /*onednn=*/false);
  const int fold = IndexOf(c.snapshots, "fold convolution affine");
  ASSERT_GT(fold, 0);
  ASSERT_FALSE(c.snapshots.passes(fold).unchanged());

  EXPECT_EQ(ActivationOps(GraphAfter(c.snapshots, fold - 1)),
            (std::vector<std::string>{"aten::convolution", "aten::sub.Tensor", "aten::mul.Tensor",
                                      "aten::mul.Tensor", "aten::add.Tensor"}));
  // After folding the convolution defines the batch norm's result; the last snapshot is the
  // graph the plan was built from.
  for (int i : {fold, c.snapshots.passes_size() - 1}) {
    const Graph& after = GraphAfter(c.snapshots, i);
    EXPECT_EQ(ActivationOps(after), std::vector<std::string>{"aten::convolution"})
        << c.snapshots.passes(i).name();
    for (const auto& n : after.nodes()) {
      if (n.op() == "aten::convolution") {
        EXPECT_EQ(n.outputs(0).id(), cb.out);
      }
    }
  }
  EXPECT_EQ(c.body.plan().steps_size(), 1);  // the plan agrees: one convolution per call
}

TEST(PassSnapshotTest, UnchangedGraphIsNotRepeatedAndConstantsCarryNoData) {
  GraphBuilder b;
  uint32_t x = b.Input({4});
  uint32_t c = b.Constant({4}, kF32, std::string(16, '\1'));
  b.Output(b.Op("aten::add.Tensor", {V(x), V(c)}, {4}));
  PassSnapshots snapshots;
  PassLog log(&snapshots);
  log.Record("received", b.graph());
  Graph same = log.After("dead code", EliminateDeadCode(b.graph()));

  ASSERT_EQ(snapshots.passes_size(), 2);
  EXPECT_FALSE(snapshots.passes(0).unchanged());
  ASSERT_EQ(snapshots.passes(0).graph().constants_size(), 1);
  EXPECT_EQ(snapshots.passes(0).graph().constants(0).value().id(), c);
  EXPECT_TRUE(snapshots.passes(0).graph().constants(0).data().empty());
  EXPECT_EQ(snapshots.passes(0).graph().nodes_size(), 1);
  EXPECT_TRUE(snapshots.passes(1).unchanged());
  EXPECT_FALSE(snapshots.passes(1).has_graph());
  // The pass's own result keeps its constant's data.
  EXPECT_EQ(same.constants(0).data().size(), 16u);

  b.Output(b.Op("aten::mul.Tensor", {V(x), F(2.0)}, {4}));
  log.Record("changed", b.graph());
  ASSERT_EQ(snapshots.passes_size(), 3);
  EXPECT_FALSE(snapshots.passes(2).unchanged());
  EXPECT_EQ(snapshots.passes(2).graph().nodes_size(), 2);

  // What the artifact carries reads back as the same snapshots.
  auto read = ReadPassSnapshots(CompressPassSnapshots(snapshots));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), snapshots.SerializeAsString());
  EXPECT_FALSE(ReadPassSnapshots("not zlib").ok());
}

TEST(PassSnapshotTest, RecordingLeavesThePassesResultUnchanged) {
  ConvBn cb;
  PassSnapshots snapshots;
  PassLog log(&snapshots);
  const Graph logged = RunGraphPasses(cb.b.graph(), nullptr, &log);
  const Graph plain = RunGraphPasses(cb.b.graph());
  EXPECT_EQ(logged.SerializeAsString(), plain.SerializeAsString());
  ASSERT_FALSE(snapshots.passes().empty());
  EXPECT_EQ(snapshots.passes(snapshots.passes_size() - 1).name(), "dead code");
  // ConvBn has no constants: the last snapshot is exactly the result.
  EXPECT_EQ(GraphAfter(snapshots, snapshots.passes_size() - 1).SerializeAsString(),
            plain.SerializeAsString());
}

}  // namespace
}  // namespace kiln::compiler
