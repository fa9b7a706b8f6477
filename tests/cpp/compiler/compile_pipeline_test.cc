// The CPU compile pipeline stage by stage: graph passes on hand-built graphs, fusion and buffer
// plans, and generated kernels run through dlopen on buffers laid out as the plan says.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/cpu_compiler.h"
#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_classes.h"
#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/conv_folding.h"
#include "compiler/passes/fusion.h"
#include "compiler/passes/graph_passes.h"
#include "compiler/passes/memory_plan.h"
#include "compiler/passes/onednn_passes.h"
#include "compiler/toolchain/toolchain.h"
#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/kernel_abi.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::compiler {
namespace {

using kiln::testing::B;
using kiln::testing::ConvBn;
using kiln::testing::F;
using kiln::testing::GraphBuilder;
using kiln::testing::I;
using kiln::testing::Ints;
using kiln::testing::Iota;
using kiln::testing::kF32;
using kiln::testing::Named;
using kiln::testing::None;
using kiln::testing::RowMajor;
using kiln::testing::V;
using kiln::v1::Argument;
using kiln::v1::DType;
using kiln::v1::Graph;

std::vector<std::string> Ops(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) ops.push_back(n.op());
  return ops;
}

int64_t StorageBytes(const kiln::v1::TensorMeta& m) {
  int64_t last = m.storage_offset();
  for (int d = 0; d < m.sizes_size(); ++d) last += (m.sizes(d) - 1) * m.strides(d);
  return (last + 1) * ElementSize(m.dtype());
}

// Runs the kernel steps of a compiled artifact the way the client runtime does: buffers
// allocated from their metadata (arena buffers at their offsets), constants bound from the plan,
// and a check that no step reads a released value. Library steps fail the test.
class PlanRunner {
 public:
  explicit PlanRunner(const kiln::v1::ArtifactBody& body) : plan_(body.plan()) {
    const std::string path = dir_.Sub("kernels.so");
    std::ofstream(path, std::ios::binary) << body.kernel_binary();
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    for (const auto& v : plan_.values()) meta_[v.id()] = v.meta();
    // Garbage in the arena: a kernel that reads a buffer before writing it shows up.
    arena_.assign(plan_.arena_bytes() + 64, 0xA5);
    for (const auto& c : plan_.constants()) {
      storage_[c.value().id()].assign(c.data().begin(), c.data().end());
      data_[c.value().id()] = storage_[c.value().id()].data();
    }
  }
  ~PlanRunner() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  void Bind(uint32_t id, const void* data) { data_[id] = const_cast<void*>(data); }

  void Run() {
    ASSERT_NE(handle_, nullptr);
    std::map<uint32_t, const kiln::v1::Buffer*> buffers;
    for (const auto& b : plan_.buffers()) buffers[b.id()] = &b;
    auto* arena = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(arena_.data()) + 63) / 64 * 64);
    std::set<uint32_t> released;
    for (const auto& step : plan_.steps()) {
      ASSERT_TRUE(step.has_kernel()) << "library step " << step.library().op();
      const auto& k = step.kernel();
      std::vector<void*> args;
      for (uint32_t id : k.args()) {
        EXPECT_EQ(released.count(id), 0u) << "value " << id << " read after its release";
        if (!data_.count(id)) {
          auto b = buffers.find(id);
          ASSERT_NE(b, buffers.end()) << "value " << id << " is neither bound nor a buffer";
          const auto& m = meta_.at(id);
          const int64_t skip = m.storage_offset() * ElementSize(m.dtype());
          if (b->second->in_arena()) {
            data_[id] = arena + b->second->arena_offset() + skip;
          } else {
            storage_[id].assign(StorageBytes(m), 0xA5);
            data_[id] = storage_[id].data() + skip;
          }
        }
        args.push_back(data_[id]);
      }
      auto fn = reinterpret_cast<kiln_kernel_fn>(dlsym(handle_, k.symbol().c_str()));
      ASSERT_NE(fn, nullptr) << k.symbol();
      fn(args.data(), &kiln::testing::ChunkedParallelFor);
      released.insert(step.release().begin(), step.release().end());
    }
  }

  template <typename T>
  const T* Data(uint32_t id) const {
    return static_cast<const T*>(data_.at(id));
  }

 private:
  kiln::testing::TempDir dir_;
  kiln::v1::ExecutionPlan plan_;
  void* handle_ = nullptr;
  std::map<uint32_t, kiln::v1::TensorMeta> meta_;
  std::vector<unsigned char> arena_;
  std::map<uint32_t, std::vector<unsigned char>> storage_;
  std::map<uint32_t, void*> data_;
};

int KernelSteps(const kiln::v1::ExecutionPlan& plan) {
  int n = 0;
  for (const auto& s : plan.steps()) n += s.has_kernel();
  return n;
}

// ---------------------------------------------------------------------------------------------
// Graph passes.

TEST(GraphPassesTest, DeadCodeEliminationKeepsOnlyWhatOutputsNeed) {
  GraphBuilder b;
  uint32_t x = b.Input({4});
  uint32_t unused_input = b.Input({4});
  uint32_t c = b.Constant({1}, kF32, std::string(4, '\0'));
  uint32_t live = b.Op("aten::exp", {V(x)}, {4});
  uint32_t dead = b.Op("aten::mul.Tensor", {V(live), V(c)}, {4});
  b.Op("aten::relu", {V(dead)}, {4});
  b.Output(live);
  PassStats stats;
  Graph g = EliminateDeadCode(b.graph(), &stats);
  EXPECT_EQ(Ops(g), std::vector<std::string>{"aten::exp"});
  EXPECT_EQ(g.constants_size(), 0);
  ASSERT_EQ(g.inputs_size(), 2);  // the call signature never changes
  EXPECT_EQ(g.inputs(1).id(), unused_input);
  EXPECT_EQ(stats.dead_nodes, 2);
  EXPECT_EQ(stats.dead_constants, 1);
}

TEST(GraphPassesTest, CommonSubexpressionsAreComputedOnce) {
  GraphBuilder b;
  uint32_t x = b.Input({4});
  uint32_t y = b.Input({4});
  uint32_t e1 = b.Op("aten::exp", {V(x)}, {4});
  uint32_t e2 = b.Op("aten::exp", {V(x)}, {4});
  uint32_t a1 = b.Op("aten::add.Tensor", {V(e1), V(y)}, {4});
  uint32_t a2 = b.Op("aten::add.Tensor", {V(e2), V(y)}, {4});  // same once e2 is e1
  uint32_t a3 = b.Op("aten::add.Tensor", {V(y), V(e1)}, {4});  // other argument order
  uint32_t a4 = b.Op("aten::add.Tensor", {V(e1), V(y), Named("alpha", I(2))}, {4});
  uint32_t sum = b.Op("aten::add.Tensor", {V(a1), V(a2)}, {4});
  b.Output(sum);
  b.Output(a3);
  b.Output(a4);
  PassStats stats;
  Graph g = EliminateDeadCode(EliminateCommonSubexpressions(b.graph(), &stats));
  EXPECT_EQ(stats.common_nodes, 2);
  ASSERT_EQ(g.nodes_size(), 5);  // exp, a1, a3, a4, sum
  const auto& last = g.nodes(4);
  EXPECT_EQ(last.args(0).value(), a1);
  EXPECT_EQ(last.args(1).value(), a1);
}

TEST(GraphPassesTest, NodesDefiningGraphOutputsAreNeverMerged) {
  GraphBuilder b;
  uint32_t x = b.Input({4});
  uint32_t e1 = b.Op("aten::exp", {V(x)}, {4});
  uint32_t e2 = b.Op("aten::exp", {V(x)}, {4});
  b.Output(e1);
  b.Output(e2);
  Graph g = RunGraphPasses(b.graph());
  EXPECT_EQ(g.nodes_size(), 2);
}

TEST(GraphPassesTest, IdentityViewsAndCopiesAreRemoved) {
  GraphBuilder b;
  uint32_t x = b.Input({4, 4});
  uint32_t same = b.Op("aten::view", {V(x), Ints({4, 4})}, {4, 4});
  uint32_t perm = b.Op("aten::permute", {V(same), Ints({0, 1})}, {4, 4});
  uint32_t copy = b.Op("aten::clone", {V(perm)}, {4, 4});
  uint32_t swapped = b.Op("aten::permute", {V(copy), Ints({1, 0})}, {4, 4}, kF32, {1, 4});
  uint32_t out = b.Op("aten::relu", {V(swapped)}, {4, 4});
  uint32_t returned_view = b.Op("aten::view", {V(x), Ints({4, 4})}, {4, 4});
  b.Output(out);
  b.Output(returned_view);
  PassStats stats;
  Graph g = RunGraphPasses(b.graph(), &stats);
  EXPECT_EQ(stats.identity_nodes, 3);
  EXPECT_EQ(Ops(g), (std::vector<std::string>{"aten::permute", "aten::relu", "aten::view"}));
  EXPECT_EQ(g.nodes(0).args(0).value(), x);  // the real transpose now reads x
}

TEST(GraphPassesTest, MultiplyingByOneAndSubtractingZeroAreDroppedButAddingZeroIsNot) {
  GraphBuilder b;
  uint32_t x = b.Input({4, 4});
  uint32_t m = b.Op("aten::mul.Tensor", {V(x), I(1)}, {4, 4});
  uint32_t d = b.Op("aten::div.Tensor", {V(m), F(1.0)}, {4, 4});
  uint32_t s = b.Op("aten::sub.Tensor", {V(d), I(0)}, {4, 4});
  uint32_t a = b.Op("aten::add.Tensor", {V(s), F(0.0)}, {4, 4});  // -0.0 + 0 is +0.0
  uint32_t twice = b.Op("aten::mul.Tensor", {V(a), F(2.0)}, {4, 4});
  uint32_t widened = b.Op("aten::mul.Tensor", {V(x), F(1.0)}, {4, 4}, kiln::v1::DTYPE_FLOAT64);
  b.Output(twice);
  b.Output(widened);
  PassStats stats;
  Graph g = RunGraphPasses(b.graph(), &stats);
  EXPECT_EQ(stats.identity_nodes, 3);
  EXPECT_EQ(Ops(g),
            (std::vector<std::string>{"aten::add.Tensor", "aten::mul.Tensor", "aten::mul.Tensor"}));
  EXPECT_EQ(g.nodes(0).args(0).value(), x);
}

TEST(GraphPassesTest, ReshapesMoveAboveBiasAddsSoTheEpilogueIsOneKernel) {
  // A linear over [2, 3, 8]: mm on the 2-D view, bias added in 2-D, then viewed back and fed to
  // a GELU-like chain in 3-D; the 2-D view the next mm reads stays where it is.
  GraphBuilder b;
  uint32_t x = b.Input({6, 8});
  uint32_t w = b.Input({8, 4});
  uint32_t bias = b.Input({4});
  uint32_t per_row = b.Input({6, 1});
  uint32_t mm = b.Op("aten::mm", {V(x), V(w)}, {6, 4});
  uint32_t add = b.Op("aten::add.Tensor", {V(mm), V(bias)}, {6, 4});
  uint32_t v3 = b.Op("aten::view", {V(add), Ints({2, 3, 4})}, {2, 3, 4});
  uint32_t act = b.Op("aten::tanh", {V(v3)}, {2, 3, 4});
  uint32_t v2 = b.Op("aten::view", {V(act), Ints({6, 4})}, {6, 4});
  uint32_t mm2 = b.Op("aten::mm", {V(v2), V(b.Input({4, 4}))}, {6, 4});
  // A per-row operand does not broadcast the same way over [2, 3, 4]: no hoist.
  uint32_t scaled = b.Op("aten::mul.Tensor", {V(mm2), V(per_row)}, {6, 4});
  uint32_t v4 = b.Op("aten::view", {V(scaled), Ints({2, 3, 4})}, {2, 3, 4});
  uint32_t out = b.Op("aten::relu", {V(v4)}, {2, 3, 4});
  b.Output(out);
  PassStats stats;
  Graph g = RunGraphPasses(b.graph(), &stats);
  EXPECT_EQ(stats.hoisted_views, 1);
  EXPECT_EQ(Ops(g), (std::vector<std::string>{"aten::mm", "aten::view", "aten::add.Tensor",
                                              "aten::tanh", "aten::view", "aten::mm",
                                              "aten::mul.Tensor", "aten::view", "aten::relu"}));
  EXPECT_EQ(g.nodes(1).args(0).value(), mm);
  // The hoisted reshape is an aten::view a library step can call: (Tensor, int[] size).
  ASSERT_EQ(g.nodes(1).args_size(), 2);
  EXPECT_EQ(std::vector<int64_t>(g.nodes(1).args(1).int_list().values().begin(),
                                 g.nodes(1).args(1).int_list().values().end()),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(g.nodes(2).outputs(0).id(), v3);  // the add now defines the 3-D value
  EXPECT_EQ(g.nodes(2).args(1).value(), bias);
  FusedProgram program = FuseGraph(g);
  int kernels = 0;
  for (const FusedStep& step : program.steps) kernels += step.is_kernel;
  EXPECT_EQ(kernels, 3);  // add + tanh, mul, relu
}

TEST(GraphPassesTest, Float32MatrixProductsGoToOneDnnWithTheWeightUntransposed) {
  GraphBuilder b;
  uint32_t x = b.Input({8, 32});
  uint32_t w = b.Input({16, 32});  // a linear's weight [out, in]
  uint32_t wt = b.Op("aten::permute", {V(w), Ints({1, 0})}, {32, 16}, kF32, {1, 32});
  uint32_t y = b.Op("aten::mm", {V(x), V(wt)}, {8, 16});
  uint32_t k = b.Input({16, 4});  // used as stored: [in, out]
  uint32_t z = b.Op("aten::mm", {V(y), V(k)}, {8, 4});
  uint32_t xi = b.Input({8, 32}, kiln::v1::DTYPE_INT64);
  uint32_t wi = b.Input({32, 2}, kiln::v1::DTYPE_INT64);
  uint32_t zi = b.Op("aten::mm", {V(xi), V(wi)}, {8, 2}, kiln::v1::DTYPE_INT64);
  b.Output(z);
  b.Output(zi);
  PassStats stats;
  Graph g = EliminateDeadCode(UseOneDnnLinear(b.graph(), &stats));
  EXPECT_EQ(stats.onednn_linears, 2);
  ASSERT_EQ(Ops(g), (std::vector<std::string>{"mkldnn::_linear_pointwise", "aten::permute",
                                              "mkldnn::_linear_pointwise", "aten::mm"}));
  EXPECT_EQ(g.nodes(0).args(1).value(), w);  // the permute of w is gone
  EXPECT_EQ(g.nodes(0).outputs(0).id(), y);
  const auto& kt = g.nodes(1).outputs(0).meta();  // k^T: a view with swapped sizes and strides
  EXPECT_EQ(g.nodes(1).args(0).value(), k);
  EXPECT_EQ(std::vector<int64_t>(kt.sizes().begin(), kt.sizes().end()),
            (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(std::vector<int64_t>(kt.strides().begin(), kt.strides().end()),
            (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(g.nodes(2).args(1).value(), g.nodes(1).outputs(0).id());
  EXPECT_EQ(g.nodes(2).outputs(0).id(), z);
  // The rewritten graph is still a valid request under the default allowlist.
  kiln::v1::CompileRequest request;
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
  *request.mutable_graph() = g;
  EXPECT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok())
      << ValidateRequest(request, OpAllowlist::Default());
}

TEST(GraphPassesTest, CopiesThatOutputsAreViewsOfStayDistinct) {
  // Eager returns two fresh tensors here; neither may become a view of x or of the other.
  GraphBuilder b;
  uint32_t x = b.Input({4, 4});
  uint32_t c1 = b.Op("aten::clone", {V(x)}, {4, 4});
  uint32_t c2 = b.Op("aten::clone", {V(x)}, {4, 4});
  b.Output(b.Op("aten::view", {V(c1), Ints({16})}, {16}));
  b.Output(b.Op("aten::view", {V(c2), Ints({16})}, {16}));
  // A copy only computations read is merged and then dropped.
  uint32_t c3 = b.Op("aten::clone", {V(x)}, {4, 4});
  uint32_t c4 = b.Op("aten::clone", {V(x)}, {4, 4});
  b.Output(b.Op("aten::add.Tensor", {V(c3), V(c4)}, {4, 4}));
  PassStats stats;
  Graph g = RunGraphPasses(b.graph(), &stats);
  EXPECT_EQ(Ops(g), (std::vector<std::string>{"aten::clone", "aten::clone", "aten::view",
                                              "aten::view", "aten::add.Tensor"}));
  EXPECT_EQ(g.nodes(2).args(0).value(), c1);
  EXPECT_EQ(g.nodes(3).args(0).value(), c2);
  EXPECT_EQ(g.nodes(4).args(0).value(), x);
  EXPECT_EQ(g.nodes(4).args(1).value(), x);
}

TEST(GraphPassesTest, ViewOfViewOfRowMajorTensorReadsTheBase) {
  GraphBuilder b;
  uint32_t x = b.Input({2, 8});
  uint32_t flat = b.Op("aten::view", {V(x), Ints({16})}, {16});
  uint32_t square = b.Op("aten::_unsafe_view", {V(flat), Ints({4, 4})}, {4, 4});
  b.Output(square);
  // Not foldable: the inner view's base is a transposed (non-row-major) tensor.
  uint32_t t = b.Input({8, 2}, kF32, {1, 8});
  uint32_t tv = b.Op("aten::view", {V(t), Ints({8, 2})}, {8, 2}, kF32, {1, 8});
  uint32_t tv2 = b.Op("aten::view", {V(tv), Ints({8, 2, 1})}, {8, 2, 1}, kF32, {1, 8, 1});
  b.Output(tv2);
  PassStats stats;
  Graph g = RunGraphPasses(b.graph(), &stats);
  EXPECT_EQ(stats.folded_views, 1);
  EXPECT_EQ(Ops(g), (std::vector<std::string>{"aten::_unsafe_view", "aten::view"}));
  EXPECT_EQ(g.nodes(0).args(0).value(), x);
  EXPECT_EQ(g.nodes(1).args(0).value(), t);  // tv was an identity view
}

// ---------------------------------------------------------------------------------------------
// Fusion and plans (no toolchain).

TEST(FusionTest, IndependentLibraryCallMovesBeforeTheOpenGroup) {
  GraphBuilder b;
  uint32_t x = b.Input({4, 4});
  uint32_t y = b.Input({4, 4});
  uint32_t e = b.Op("aten::exp", {V(x)}, {4, 4});
  uint32_t m = b.Op("aten::mm", {V(y), V(y)}, {4, 4});
  uint32_t out = b.Op("aten::add.Tensor", {V(e), V(m)}, {4, 4});
  b.Output(out);
  FusedProgram program = FuseGraph(b.graph());
  ASSERT_EQ(program.steps.size(), 2u);
  EXPECT_FALSE(program.steps[0].is_kernel);
  EXPECT_TRUE(program.steps[1].is_kernel);
  EXPECT_EQ(program.groups[program.steps[1].group].nodes.size(), 2u);
}

TEST(FusionTest, SoftmaxIsOneRowWiseKernel) {
  constexpr int R = 64, C = 37;
  GraphBuilder b;
  uint32_t x = b.Input({R, C});
  uint32_t m = b.Op("aten::amax", {V(x), Ints({1}), B(true)}, {R, 1});
  uint32_t d = b.Op("aten::sub.Tensor", {V(x), V(m)}, {R, C});
  uint32_t e = b.Op("aten::exp", {V(d)}, {R, C});
  uint32_t z = b.Op("aten::sum.dim_IntList", {V(e), Ints({-1}), B(true)}, {R, 1});
  uint32_t o = b.Op("aten::div.Tensor", {V(e), V(z)}, {R, C});
  b.Output(o);
  FusedProgram program = FuseGraph(b.graph());
  ASSERT_EQ(program.groups.size(), 1u);
  EXPECT_EQ(program.groups[0].outer_rank, 1);
  EXPECT_EQ(program.groups[0].nodes.size(), 5u);
  EXPECT_EQ(program.groups[0].outputs, std::vector<uint32_t>{o});

  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->plan().steps_size(), 1);
  // exp(x - max), the sum's input, is computed once per row into a buffer the epilogue reads.
  const std::string& src = body->kernel_source();
  EXPECT_NE(src.find("float buf" + std::to_string(e) + "[37];"), std::string::npos) << src;
  EXPECT_EQ(src.find("std::exp", src.find("std::exp") + 1), std::string::npos) << src;
  std::vector<float> xs = Iota(R * C, -20.f, 0.017f);
  xs[5] = NAN;  // row 0 is all NaN in eager
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Run();
  for (int r = 0; r < R; ++r) {
    float mx = -INFINITY, sum = 0;
    for (int c = 0; c < C; ++c) mx = std::max(mx, xs[r * C + c]);
    for (int c = 0; c < C; ++c) sum += std::exp(xs[r * C + c] - mx);
    for (int c = 0; c < C; ++c) {
      const float got = run.Data<float>(o)[r * C + c];
      if (r == 0) {
        ASSERT_TRUE(std::isnan(got)) << c;
      } else {
        ASSERT_NEAR(got, std::exp(xs[r * C + c] - mx) / sum, 1e-6) << r << "," << c;
      }
    }
  }
}

TEST(FusionTest, RowsWithoutKeepdimAndLeadingReductionsDoNotJoinTheGroup) {
  GraphBuilder b;
  uint32_t x = b.Input({8, 16});
  uint32_t s = b.Op("aten::sum.dim_IntList", {V(x), Ints({1}), B(false)}, {8});
  uint32_t sq = b.Op("aten::mul.Tensor", {V(s), V(s)}, {8});
  uint32_t lead = b.Op("aten::mean.dim", {V(x), Ints({0}), B(true)}, {1, 16});
  b.Output(sq);
  b.Output(lead);
  FusedProgram program = FuseGraph(b.graph());
  ASSERT_EQ(program.groups.size(), 2u);
  EXPECT_EQ(program.groups[0].outer_rank, 1);
  EXPECT_EQ(program.groups[0].outputs, std::vector<uint32_t>{s});
  EXPECT_EQ(program.groups[1].outer_rank, -1);
  int library = 0;
  for (const FusedStep& step : program.steps) library += !step.is_kernel;
  EXPECT_EQ(library, 1);  // the mean over the leading dim
}

TEST(FusionTest, UnsupportedDtypeBecomesALibraryCall) {
  GraphBuilder b;
  uint32_t x = b.Input({4}, kiln::v1::DTYPE_COMPLEX64);
  uint32_t y = b.Op("aten::mul.Tensor", {V(x), V(x)}, {4}, kiln::v1::DTYPE_COMPLEX64);
  b.Output(y);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->format(), kiln::v1::BINARY_FORMAT_UNSPECIFIED);
  EXPECT_TRUE(body->kernel_binary().empty());
  ASSERT_EQ(body->plan().steps_size(), 1);
  EXPECT_EQ(body->plan().steps(0).library().op(), "aten::mul.Tensor");
}

TEST(MemoryPlanTest, ArenaReusesBytesOfDeadBuffersAndReleasesLibraryResults) {
  // exp -> mm -> exp -> mm -> exp -> mm: each exp result lives from its kernel to the next mm
  // only, so all three share offset 0; each mm result is released after the kernel reading it.
  GraphBuilder b;
  uint32_t v = b.Input({8, 8});
  std::vector<uint32_t> exps, mms;
  for (int i = 0; i < 3; ++i) {
    exps.push_back(b.Op("aten::exp", {V(v)}, {8, 8}));
    mms.push_back(v = b.Op("aten::mm", {V(exps.back()), V(exps.back())}, {8, 8}));
  }
  b.Output(v);
  kiln::v1::ExecutionPlan plan = BuildPlan(b.graph(), FuseGraph(b.graph()));
  ASSERT_EQ(plan.steps_size(), 6);
  ASSERT_EQ(plan.buffers_size(), 3);
  for (const auto& buffer : plan.buffers()) {
    EXPECT_TRUE(buffer.in_arena());
    EXPECT_EQ(buffer.arena_offset(), 0u);
  }
  EXPECT_EQ(plan.arena_bytes(), 256u);
  EXPECT_EQ(plan.steps(2).release(0), mms[0]);
  EXPECT_EQ(plan.steps(4).release(0), mms[1]);
  for (int s : {0, 1, 3, 5}) EXPECT_EQ(plan.steps(s).release_size(), 0) << s;
  // Every value the plan names has metadata.
  std::set<uint32_t> described;
  for (const auto& value : plan.values()) described.insert(value.id());
  for (uint32_t id = 0; id <= v; ++id) EXPECT_EQ(described.count(id), 1u) << id;
}

TEST(MemoryPlanTest, BuffersReadByViewsOrReturnedStayOutOfTheArena) {
  GraphBuilder b;
  uint32_t x = b.Input({4, 4});
  uint32_t e = b.Op("aten::exp", {V(x)}, {4, 4});
  uint32_t t = b.Op("aten::t", {V(e)}, {4, 4}, kF32, {1, 4});
  uint32_t m = b.Op("aten::mm", {V(t), V(x)}, {4, 4});  // reads the view, not the buffer
  uint32_t r = b.Op("aten::relu", {V(m)}, {4, 4});
  b.Output(r);
  kiln::v1::ExecutionPlan plan = BuildPlan(b.graph(), FuseGraph(b.graph()));
  ASSERT_EQ(plan.buffers_size(), 2);
  EXPECT_EQ(plan.buffers(0).id(), e);
  EXPECT_FALSE(plan.buffers(0).in_arena());
  EXPECT_FALSE(plan.buffers(1).in_arena());  // r: a plan output
  EXPECT_EQ(plan.arena_bytes(), 0u);
  // e is dropped once the view holds it; the view and m after their last readers.
  ASSERT_EQ(plan.steps_size(), 4);
  EXPECT_EQ(std::vector<uint32_t>(plan.steps(1).release().begin(), plan.steps(1).release().end()),
            std::vector<uint32_t>{e});
  EXPECT_EQ(std::vector<uint32_t>(plan.steps(2).release().begin(), plan.steps(2).release().end()),
            std::vector<uint32_t>{t});
  EXPECT_EQ(std::vector<uint32_t>(plan.steps(3).release().begin(), plan.steps(3).release().end()),
            std::vector<uint32_t>{m});
}

// ---------------------------------------------------------------------------------------------
// Generated kernels, compiled with the host g++ and run.

TEST(CpuKernelTest, AddMulReluChainIsOneKernelWithIntermediatesInRegisters) {
  GraphBuilder b;
  uint32_t x = b.Input({4, 8});
  uint32_t y = b.Input({4, 8});
  uint32_t a = b.Op("aten::add.Tensor", {V(x), V(y), Named("alpha", I(2))}, {4, 8});
  uint32_t m = b.Op("aten::mul.Tensor", {V(a), V(y)}, {4, 8});
  uint32_t out = b.Op("aten::relu", {V(m)}, {4, 8});
  b.Output(out);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->plan().steps_size(), 1);
  const auto& k = body->plan().steps(0).kernel();
  EXPECT_EQ(std::vector<uint32_t>(k.args().begin(), k.args().end()),
            (std::vector<uint32_t>{x, y, out}));
  EXPECT_EQ(std::vector<uint32_t>(k.writes().begin(), k.writes().end()),
            std::vector<uint32_t>{out});
  std::vector<float> xs = Iota(32, -4.f, 0.25f), ys = Iota(32, 1.f, -0.125f);
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(y, ys.data());
  run.Run();
  for (int i = 0; i < 32; ++i) {
    EXPECT_FLOAT_EQ(run.Data<float>(out)[i], std::max(0.f, (xs[i] + 2 * ys[i]) * ys[i])) << i;
  }
}

TEST(CpuKernelTest, BiasAndPerChannelOperandsBroadcast) {
  // out[n,c,h,w] = x * scale[1,c,1,1] + bias[w]
  GraphBuilder b;
  uint32_t x = b.Input({2, 3, 4, 5});
  uint32_t scale = b.Input({1, 3, 1, 1});
  uint32_t bias = b.Input({5});
  uint32_t m = b.Op("aten::mul.Tensor", {V(x), V(scale)}, {2, 3, 4, 5});
  uint32_t out = b.Op("aten::add.Tensor", {V(m), V(bias)}, {2, 3, 4, 5});
  b.Output(out);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(KernelSteps(body->plan()), 1);
  std::vector<float> xs = Iota(120, -3.f, 0.05f), ss = {2.f, -1.f, 0.5f}, bs = Iota(5, 10.f, 1.f);
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(scale, ss.data());
  run.Bind(bias, bs.data());
  run.Run();
  for (int i = 0; i < 120; ++i) {
    const int c = i / 20 % 3, w = i % 5;
    EXPECT_FLOAT_EQ(run.Data<float>(out)[i], xs[i] * ss[c] + bs[w]) << i;
  }
}

TEST(CpuKernelTest, TransposedInputsAndFoldedViewsReadThroughTheirStrides) {
  // Large enough for the parallel loop nest: [256, 160] = 40960 elements.
  constexpr int R = 256, C = 160;
  GraphBuilder b;
  uint32_t xt = b.Input({R, C}, kF32, {1, R});  // a transposed tensor from the caller
  uint32_t base = b.Input({C, R});
  uint32_t t = b.Op("aten::transpose.int", {V(base), I(0), I(1)}, {R, C}, kF32, {1, R});
  uint32_t out = b.Op("aten::sub.Tensor", {V(xt), V(t)}, {R, C});
  uint32_t sq = b.Op("aten::pow.Tensor_Scalar", {V(out), F(2.0)}, {R, C});
  b.Output(sq);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->plan().steps_size(), 1);  // the transpose is folded into the kernel
  EXPECT_NE(body->kernel_source().find("kiln_parallel_for(0, "), std::string::npos);
  std::vector<float> xs = Iota(R * C, -1.f, 1e-4f), bs = Iota(R * C, 2.f, -3e-5f);
  PlanRunner run(*body);
  run.Bind(xt, xs.data());
  run.Bind(base, bs.data());
  run.Run();
  for (int r = 0; r < R; r += 7) {
    for (int c = 0; c < C; c += 3) {
      const float d = xs[c * R + r] - bs[c * R + r];
      ASSERT_FLOAT_EQ(run.Data<float>(sq)[r * C + c], d * d) << r << "," << c;
    }
  }
}

uint16_t ToBf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(CpuKernelTest, Bfloat16RoundsEveryOpToItsStorageType) {
  constexpr DType kBf16 = kiln::v1::DTYPE_BFLOAT16;
  GraphBuilder b;
  uint32_t x = b.Input({64}, kBf16);
  uint32_t y = b.Input({64}, kBf16);
  uint32_t s = b.Op("aten::add.Tensor", {V(x), V(y)}, {64}, kBf16);
  uint32_t out = b.Op("aten::mul.Tensor", {V(s), V(x)}, {64}, kBf16);
  uint32_t wide = b.Op("aten::_to_copy", {V(out), Named("dtype", I(6))}, {64}, kF32);
  b.Output(out);
  b.Output(wide);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(KernelSteps(body->plan()), 1);
  std::vector<uint16_t> xs(64), ys(64);
  for (int i = 0; i < 64; ++i) {
    xs[i] = ToBf16(1.f + static_cast<float>(i) / 3.f);
    ys[i] = ToBf16(-0.7f + static_cast<float>(i) / 7.f);
  }
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(y, ys.data());
  run.Run();
  for (int i = 0; i < 64; ++i) {
    const uint16_t sum = ToBf16(FromBf16(xs[i]) + FromBf16(ys[i]));
    const uint16_t expect = ToBf16(FromBf16(sum) * FromBf16(xs[i]));
    EXPECT_EQ(run.Data<uint16_t>(out)[i], expect) << i;
    EXPECT_EQ(run.Data<float>(wide)[i], FromBf16(expect)) << i;
  }
}

TEST(CpuKernelTest, Int64AndBoolComputeExactly) {
  constexpr DType kI64 = kiln::v1::DTYPE_INT64, kBool = kiln::v1::DTYPE_BOOL;
  GraphBuilder b;
  uint32_t a = b.Input({10}, kI64);
  uint32_t c = b.Input({10}, kI64);
  uint32_t mask = b.Input({10}, kBool);
  uint32_t s = b.Op("aten::add.Tensor", {V(a), V(c), Named("alpha", I(3))}, {10}, kI64);
  uint32_t gt = b.Op("aten::gt.Scalar", {V(s), I(5)}, {10}, kBool);
  uint32_t w = b.Op("aten::where.self", {V(gt), V(s), V(a)}, {10}, kI64);
  uint32_t both = b.Op("aten::logical_and", {V(gt), V(mask)}, {10}, kBool);
  b.Output(w);
  b.Output(both);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->plan().steps_size(), 1);
  EXPECT_EQ(body->plan().steps(0).kernel().args_size(), 5);  // a, c, mask, w, both
  std::vector<int64_t> as(10), cs(10);
  bool ms[10];
  for (int i = 0; i < 10; ++i) {
    as[i] = (int64_t{1} << 40) * (i % 2) + i - 5;
    cs[i] = 2 - i;
    ms[i] = i % 3 != 0;
  }
  PlanRunner run(*body);
  run.Bind(a, as.data());
  run.Bind(c, cs.data());
  run.Bind(mask, ms);
  run.Run();
  for (int i = 0; i < 10; ++i) {
    const int64_t sum = as[i] + 3 * cs[i];
    EXPECT_EQ(run.Data<int64_t>(w)[i], sum > 5 ? sum : as[i]) << i;
    EXPECT_EQ(run.Data<bool>(both)[i], sum > 5 && ms[i]) << i;
  }
}

TEST(CpuKernelTest, LoopsFollowTheOutputsMemoryOrder) {
  // A channels-last [N, C, H, W] activation plus a per-channel bias: walked in memory order, N, H
  // and W collapse into one outer loop and the inner loop runs over C with stride 1 (in the
  // order of the sizes it would walk W with stride C).
  constexpr int N = 2, C = 8, H = 4, W = 4;
  const std::vector<int64_t> cl{H * W * C, 1, W * C, C};
  GraphBuilder b;
  uint32_t x = b.Input({N, C, H, W}, kF32, cl);
  uint32_t bias = b.Input({C, 1, 1});
  uint32_t y = b.Op("aten::add.Tensor", {V(x), V(bias)}, {N, C, H, W}, kF32, cl);
  uint32_t r = b.Op("aten::relu", {V(y)}, {N, C, H, W}, kF32, cl);
  b.Output(r);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  const std::string& src = body->kernel_source();
  EXPECT_NE(src.find("i0 < 32"), std::string::npos) << src;
  EXPECT_NE(src.find("i1 < 8"), std::string::npos) << src;
  EXPECT_NE(src.find("out0[0 + i0 * 8 + i1 * 1]"), std::string::npos) << src;
  std::vector<float> xs = Iota(N * C * H * W, -3.f, 0.05f), bs = Iota(C, -0.5f, 0.125f);
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(bias, bs.data());
  run.Run();
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < H; ++h)
        for (int w = 0; w < W; ++w) {
          const int64_t at = n * cl[0] + c * cl[1] + h * cl[2] + w * cl[3];
          ASSERT_FLOAT_EQ(run.Data<float>(r)[at], std::max(0.f, xs[at] + bs[c]));
        }
}

TEST(CpuKernelTest, IntermediateReadByALaterGroupBecomesAnArenaBuffer) {
  // Group 1 over [4, 8]: a = x + y, p = a * a (returned). Group 2 over [2, 4, 8]: q = z - a.
  GraphBuilder b;
  uint32_t x = b.Input({4, 8});
  uint32_t y = b.Input({4, 8});
  uint32_t z = b.Input({2, 4, 8});
  uint32_t a = b.Op("aten::add.Tensor", {V(x), V(y)}, {4, 8});
  uint32_t p = b.Op("aten::mul.Tensor", {V(a), V(a)}, {4, 8});
  uint32_t q = b.Op("aten::sub.Tensor", {V(z), V(a)}, {2, 4, 8});
  b.Output(p);
  b.Output(q);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  const auto& plan = body->plan();
  ASSERT_EQ(KernelSteps(plan), 2);
  std::map<uint32_t, bool> arena;
  for (const auto& buffer : plan.buffers()) arena[buffer.id()] = buffer.in_arena();
  EXPECT_EQ(arena, (std::map<uint32_t, bool>{{a, true}, {p, false}, {q, false}}));
  std::vector<float> xs = Iota(32, 0.5f, 0.5f), ys = Iota(32, -2.f, 0.1f),
                     zs = Iota(64, 3.f, -0.2f);
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(y, ys.data());
  run.Bind(z, zs.data());
  run.Run();
  for (int i = 0; i < 64; ++i) {
    const float ai = xs[i % 32] + ys[i % 32];
    if (i < 32) {
      EXPECT_FLOAT_EQ(run.Data<float>(p)[i], ai * ai) << i;
    }
    EXPECT_FLOAT_EQ(run.Data<float>(q)[i], zs[i] - ai) << i;
  }
}

TEST(CpuKernelTest, OneElementConstantsAreFoldedIntoTheCode) {
  GraphBuilder b;
  float half = 0.5f;
  uint32_t x = b.Input({16});
  uint32_t scalar = b.Input({});
  uint32_t c = b.Constant({}, kF32, std::string(reinterpret_cast<char*>(&half), 4));
  uint32_t out = b.Op("aten::mul.Tensor", {V(x), V(c)}, {16});
  uint32_t out0d = b.Op("aten::sub.Tensor", {V(scalar), V(c)}, {});  // a 0-d iteration space
  b.Output(out);
  b.Output(out0d);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->plan().constants_size(), 0);
  ASSERT_EQ(body->plan().steps_size(), 2);
  EXPECT_EQ(body->plan().steps(0).kernel().args_size(), 2);  // x, out
  EXPECT_EQ(body->plan().steps(1).kernel().args_size(), 2);  // scalar, out0d
  std::vector<float> xs = Iota(16, -1.f, 0.3f);
  float s = 4.25f;
  PlanRunner run(*body);
  run.Bind(x, xs.data());
  run.Bind(scalar, &s);
  run.Run();
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(run.Data<float>(out)[i], xs[i] * 0.5f) << i;
  EXPECT_EQ(*run.Data<float>(out0d), 3.75f);
}

TEST(CpuKernelTest, ToolchainRunningPastItsTimeLimitIsKilled) {
  kiln::testing::TempDir dir;
  const std::string cxx = dir.Sub("slow-cxx");
  std::ofstream(cxx) << "#!/bin/sh\ncase \"$1\" in -dump*|--version) echo 1; exit 0;; esac\n"
                        "sleep 60\n";
  ASSERT_EQ(::chmod(cxx.c_str(), 0700), 0);
  CpuCompiler compiler(CpuCompilerOptions{cxx, std::chrono::seconds(1)});
  GraphBuilder b;
  uint32_t x = b.Input({4});
  b.Output(b.Op("aten::neg", {V(x)}, {4}));
  const auto start = std::chrono::steady_clock::now();
  auto body = compiler.Compile(b.Request());
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(CompileErrorFromStatus(body.status()).code(), kiln::v1::CompileError::CODE_TOOLCHAIN);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(CpuKernelTest, BuildDirectoriesOfDeadProcessesAreRemovedAtStart) {
  kiln::testing::TempDir tmp;
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);  // reaped: no process has this id now
  auto make = [&](const std::string& name, const std::string& pid) {
    std::filesystem::create_directories(tmp.Sub(name));
    std::ofstream(tmp.Sub(name) + "/build.log") << "partial";
    if (!pid.empty()) std::ofstream(tmp.Sub(name) + "/kilnd.pid") << pid << "\n";
  };
  make("kilnd-cc-dead01", std::to_string(dead));
  make("kilnd-cc-live01", std::to_string(::getpid()));
  make("kilnd-cc-nopid1", "");
  make("other-dead01", std::to_string(dead));
  EXPECT_EQ(Toolchain::RemoveOrphanedBuildDirs(), 1);
  EXPECT_FALSE(std::filesystem::exists(tmp.Sub("kilnd-cc-dead01")));
  EXPECT_TRUE(std::filesystem::exists(tmp.Sub("kilnd-cc-live01")));
  EXPECT_TRUE(std::filesystem::exists(tmp.Sub("kilnd-cc-nopid1")));
  EXPECT_TRUE(std::filesystem::exists(tmp.Sub("other-dead01")));
  // The toolchain's own build directories name their process and are gone after a build.
  Toolchain toolchain("g++", std::chrono::seconds(60));
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind("kilnd-cc-", 0) == 0) left.insert(name);
  }
  EXPECT_EQ(left, (std::set<std::string>{"kilnd-cc-live01", "kilnd-cc-nopid1"}));
  if (old) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
}

TEST(ConvFoldingTest, EvalBatchNormFoldsIntoTheConvolutionsWeightAndBias) {
  ConvBn cb;
  PassStats stats;
  Graph g = EliminateDeadCode(FoldConvolutionAffine(RunGraphPasses(cb.b.graph()), &stats));
  EXPECT_EQ(stats.folded_convolutions, 1);
  int convs = 0;
  for (const auto& n : g.nodes()) {
    EXPECT_FALSE(n.op() == "aten::sub.Tensor" && ValuesRead(n)[0] == cb.conv);
    if (n.op() != "aten::convolution") continue;
    ++convs;
    EXPECT_EQ(n.outputs(0).id(), cb.out);   // the chain's last value, same id
    EXPECT_NE(n.args(1).value(), cb.w);     // a new weight ...
    EXPECT_NE(n.args(2).value(), cb.bias);  // ... and bias
  }
  EXPECT_EQ(convs, 1);
  // Everything the new weight and bias need is bound: the prologue computes it.
  const auto bound = BoundValues(g);
  for (const auto& n : g.nodes()) {
    if (n.op() == "aten::convolution") {
      EXPECT_TRUE(bound.count(n.args(1).value()) && bound.count(n.args(2).value()));
      EXPECT_FALSE(bound.count(n.outputs(0).id()));
    }
  }
  kiln::v1::CompileRequest request = cb.b.Request();
  *request.mutable_graph() = g;
  EXPECT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
}

// conv(x, w) then aten::_native_batch_norm_legit_no_training (the client's eval batch norm node,
// its two statistics outputs empty) then relu; the parameters are bound.
struct ConvBnNode {
  explicit ConvBnNode(kiln::v1::DType dtype, bool stats_read = false) {
    w = b.Input({4, 3, 3, 3}, dtype);
    const uint32_t gamma = b.Input({4}), beta = b.Input({4}), mean = b.Input({4}),
                   var = b.Input({4});
    b.Bound(5);
    const uint32_t x = b.Input({2, 3, 8, 8}, dtype);
    conv = b.Op("aten::convolution",
                {V(x), V(w), None(), Ints({1, 1}), Ints({0, 0}), Ints({1, 1}), B(false),
                 Ints({0, 0}), I(1)},
                {2, 4, 6, 6}, dtype);
    bn = b.Op("aten::_native_batch_norm_legit_no_training",
              {V(conv), V(gamma), V(beta), V(mean), V(var), F(0.1), F(1e-5)}, {2, 4, 6, 6},
              dtype);
    const uint32_t relu = b.Op("aten::relu", {V(bn)}, {2, 4, 6, 6}, dtype);
    request = b.Request();
    kiln::v1::Graph* g = request.mutable_graph();
    kiln::v1::Node* node = g->mutable_nodes(g->nodes_size() - 2);
    for (uint32_t id : {relu + 1, relu + 2}) {  // the empty statistics
      kiln::v1::Value* v = node->add_outputs();
      v->set_id(id);
      v->mutable_meta()->set_dtype(kiln::v1::DTYPE_FLOAT32);
      v->mutable_meta()->add_sizes(0);
      v->mutable_meta()->add_strides(1);
      *v->mutable_meta()->mutable_device() = node->outputs(0).meta().device();
    }
    g->add_outputs(relu);
    if (stats_read) g->add_outputs(relu + 1);
  }
  GraphBuilder b;
  uint32_t w = 0, conv = 0, bn = 0;
  kiln::v1::CompileRequest request;
};

TEST(ConvFoldingTest, TheEvalBatchNormNodeIsDecomposedThenFoldedIntoTheConvolution) {
  for (kiln::v1::DType dtype : {kiln::v1::DTYPE_FLOAT32, kiln::v1::DTYPE_BFLOAT16}) {
    ConvBnNode cb(dtype);
    ASSERT_TRUE(ValidateRequest(cb.request, OpAllowlist::Default()).ok());
    Graph g = DecomposeBatchNormEval(cb.request.graph());
    std::vector<std::string> ops;
    const kiln::v1::Node* defining = nullptr;
    for (const auto& n : g.nodes()) {
      ops.push_back(n.op());
      if (n.outputs(0).id() == cb.bn) defining = &n;
    }
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::_native_batch_norm_legit_no_training"), 0);
    ASSERT_NE(defining, nullptr);
    // The batch norm's own value, id and metadata, defined by the chain's last node: the add of
    // the bias in float32, the cast back for bfloat16 (computed in float32 as ATen does).
    EXPECT_EQ(defining->op(), dtype == kiln::v1::DTYPE_FLOAT32 ? "aten::add.Tensor"
                                                                 : "aten::_to_copy");
    EXPECT_EQ(defining->outputs(0).meta().dtype(), dtype);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::rsqrt"), 1);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::mul.Tensor"), 2);
    kiln::v1::CompileRequest decomposed = cb.request;
    *decomposed.mutable_graph() = g;
    EXPECT_TRUE(ValidateRequest(decomposed, OpAllowlist::Default()).ok());
    PassStats stats;
    FoldConvolutionAffine(RunGraphPasses(g), &stats);
    // Folding takes float32 convolutions.
    EXPECT_EQ(stats.folded_convolutions, dtype == kiln::v1::DTYPE_FLOAT32 ? 1 : 0);
  }
  // Statistics someone reads: the node stays (ATen's kernel computes them).
  ConvBnNode read(kiln::v1::DTYPE_FLOAT32, /*stats_read=*/true);
  Graph kept = DecomposeBatchNormEval(read.request.graph());
  int nodes = 0;
  for (const auto& n : kept.nodes()) nodes += n.op() == "aten::_native_batch_norm_legit_no_training";
  EXPECT_EQ(nodes, 1);
}

TEST(ConvFoldingTest, ConvolutionWithAnotherReaderOrUnboundOperandIsNotFolded) {
  ConvBn shared(/*extra_reader=*/true);  // the convolution's own result is also returned
  PassStats stats;
  FoldConvolutionAffine(RunGraphPasses(shared.b.graph()), &stats);
  EXPECT_EQ(stats.folded_convolutions, 0);

  GraphBuilder b;  // the scale is a per-call input, not a parameter
  uint32_t w = b.Input({4, 3, 1, 1});
  b.Bound(1);
  uint32_t x = b.Input({1, 3, 2, 2});
  uint32_t s = b.Input({4, 1, 1});
  uint32_t conv = b.Op(
      "aten::convolution",
      {V(x), V(w), None(), Ints({1, 1}), Ints({0, 0}), Ints({1, 1}), B(false), Ints({0, 0}), I(1)},
      {1, 4, 2, 2});
  b.Output(b.Op("aten::mul.Tensor", {V(conv), V(s)}, {1, 4, 2, 2}));
  PassStats stats2;
  FoldConvolutionAffine(b.graph(), &stats2);
  EXPECT_EQ(stats2.folded_convolutions, 0);
}

TEST(BoundPrologueTest, BoundValuesExcludeOutputsTheirAliasesAndRandomOps) {
  GraphBuilder b;
  uint32_t p = b.Input({4});
  b.Bound(1);
  uint32_t x = b.Input({4});
  uint32_t doubled = b.Op("aten::mul.Tensor", {V(p), F(2.0)}, {4});          // bound
  uint32_t view = b.Op("aten::view", {V(p), Ints({2, 2})}, {2, 2});          // returned view
  uint32_t noise = b.Op("aten::rand_like", {V(p)}, {4});                     // random
  uint32_t iota = b.Op("aten::arange", {I(4)}, {4}, kiln::v1::DTYPE_INT64);  // no inputs
  uint32_t sum = b.Op("aten::add.Tensor", {V(x), V(doubled)}, {4});          // per call
  b.Output(sum);
  b.Output(view);
  b.Output(noise);
  b.Output(b.Op("aten::add.Tensor", {V(x), V(iota)}, {4}));
  const auto bound = BoundValues(b.graph());
  EXPECT_TRUE(bound.count(p) && bound.count(doubled) && bound.count(iota));
  EXPECT_FALSE(bound.count(x) || bound.count(view) || bound.count(noise) || bound.count(sum));
  // Bound nodes first, each kind in its order.
  Graph g = BoundNodesFirst(b.graph(), bound);
  EXPECT_EQ(Ops(g),
            (std::vector<std::string>{"aten::mul.Tensor", "aten::arange", "aten::view",
                                      "aten::rand_like", "aten::add.Tensor", "aten::add.Tensor"}));
}

TEST(BoundPrologueTest, PlanRunsBoundWorkInThePrologueOutsideTheArena) {
  ConvBn cb;
  Graph g = EliminateDeadCode(FoldConvolutionAffine(RunGraphPasses(cb.b.graph())));
  const auto bound = BoundValues(g);
  g = BoundNodesFirst(g, bound);
  FusedProgram program = FuseGraph(g, &bound);
  kiln::v1::ExecutionPlan plan = BuildPlan(g, program, &bound);
  ASSERT_EQ(plan.steps_size(), 1);  // only the convolution runs per call
  EXPECT_EQ(plan.steps(0).library().op(), "aten::convolution");
  EXPECT_GT(plan.prologue_size(), 0);
  // The per-call step reads the folded weight and bias the prologue keeps.
  std::set<uint32_t> kept(plan.prologue_outputs().begin(), plan.prologue_outputs().end());
  EXPECT_TRUE(kept.count(plan.steps(0).library().args(1).value()));
  EXPECT_TRUE(kept.count(plan.steps(0).library().args(2).value()));
  // Run once per parameter version, the prologue is ATen's: no kernel is generated for it, and
  // nothing it makes lives in the per-call arena.
  std::set<uint32_t> prologue_values;
  for (const auto& step : plan.prologue()) {
    ASSERT_TRUE(step.has_library()) << step.DebugString();
    prologue_values.insert(step.library().outputs().begin(), step.library().outputs().end());
    for (uint32_t id : step.release()) EXPECT_FALSE(kept.count(id)) << id;
  }
  EXPECT_FALSE(prologue_values.empty());
  for (const auto& buffer : plan.buffers()) {
    if (prologue_values.count(buffer.id())) {
      EXPECT_FALSE(buffer.in_arena()) << buffer.id();
    }
  }
  for (const auto& step : plan.steps()) {
    for (uint32_t id : step.release()) EXPECT_FALSE(kept.count(id));
  }
}

// conv1 -> relu; conv2(relu) + conv3(x) -> relu: a residual block's shape, channels-last (the
// client's layout pass; see ANchwConvolutionIsCopiedBackToItsLayout).
const std::vector<int64_t> kNhwc1466{144, 1, 24, 4};

TEST(OneDnnPassesTest, ConvolutionsTakeReluAndResidualAddAsPostOps) {
  GraphBuilder b;
  uint32_t w1 = b.Input({4, 4, 3, 3}), w2 = b.Input({4, 4, 3, 3}), w3 = b.Input({4, 4, 1, 1});
  b.Bound(3);
  uint32_t x = b.Input({1, 4, 6, 6}, kF32, kNhwc1466);
  auto conv = [&](uint32_t in, uint32_t w, int64_t pad) {
    return b.Op("aten::convolution",
                {V(in), V(w), None(), Ints({1, 1}), Ints({pad, pad}), Ints({1, 1}), B(false),
                 Ints({0, 0}), I(1)},
                {1, 4, 6, 6}, kF32, kNhwc1466);
  };
  uint32_t r1 = b.Op("aten::relu", {V(conv(x, w1, 1))}, {1, 4, 6, 6}, kF32, kNhwc1466);
  uint32_t c2 = conv(r1, w2, 1);
  uint32_t c3 = conv(x, w3, 0);
  uint32_t sum = b.Op("aten::add.Tensor", {V(c2), V(c3)}, {1, 4, 6, 6}, kF32, kNhwc1466);
  uint32_t out = b.Op("aten::relu", {V(sum)}, {1, 4, 6, 6}, kF32, kNhwc1466);
  b.Output(out);
  PassStats stats;
  Graph g = EliminateDeadCode(UseOneDnnConvolution(b.graph(), &stats));
  EXPECT_EQ(stats.onednn_convolutions, 3);
  EXPECT_EQ(stats.fused_post_ops, 3);  // relu; add + relu
  std::vector<std::string> calls;
  for (const auto& n : g.nodes()) {
    if (n.op().rfind("mkldnn::_convolution", 0) == 0) calls.push_back(n.op());
    if (n.op() == "mkldnn::_convolution_pointwise.binary") {
      EXPECT_EQ(n.outputs(0).id(), out);
      EXPECT_EQ(n.args(1).value(), c3);  // the other convolution's result is the addend
      EXPECT_EQ(n.args(8).string_value(), "add");
      EXPECT_EQ(n.args(10).string_value(), "relu");
    }
    if (n.op() == "mkldnn::_convolution_pointwise" && n.outputs(0).id() == r1) {
      EXPECT_EQ(n.args(7).string_value(), "relu");
    }
    EXPECT_NE(n.op(), "aten::relu");
    EXPECT_NE(n.op(), "aten::add.Tensor");
  }
  EXPECT_EQ(calls, (std::vector<std::string>{"mkldnn::_convolution_pointwise",
                                             "mkldnn::_convolution_pointwise",
                                             "mkldnn::_convolution_pointwise.binary"}));
  // Every weight is packed, and packing is bound work.
  const auto bound = BoundValues(g);
  int packs = 0;
  for (const auto& n : g.nodes()) {
    if (n.op() != "mkldnn::_reorder_convolution_weight") continue;
    ++packs;
    EXPECT_TRUE(bound.count(n.outputs(0).id()));
  }
  EXPECT_EQ(packs, 3);
}

// oneDNN's call over a packed weight writes its result channels-last whatever the input's
// layout. An NCHW convolution (a graph the layout pass left as traced: one convolution, a
// training forward returning its activations) takes its unary post-op, writes a channels-last
// value of its own, and a copy gives the graph's NCHW value (a graph output's strides are
// eager's); a residual add stays a kernel.
TEST(OneDnnPassesTest, ANchwConvolutionIsCopiedBackToItsLayout) {
  GraphBuilder b;
  uint32_t w = b.Input({4, 4, 3, 3});
  b.Bound(1);
  uint32_t x = b.Input({1, 4, 6, 6});
  auto conv = [&]() {
    return b.Op("aten::convolution",
                {V(x), V(w), None(), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false),
                 Ints({0, 0}), I(1)},
                {1, 4, 6, 6});
  };
  uint32_t relu = b.Op("aten::relu", {V(conv())}, {1, 4, 6, 6});
  uint32_t sum = b.Op("aten::add.Tensor", {V(conv()), V(x)}, {1, 4, 6, 6});
  b.Output(relu);
  b.Output(sum);
  PassStats stats;
  Graph g = EliminateDeadCode(UseOneDnnConvolution(b.graph(), &stats));
  EXPECT_EQ(stats.onednn_convolutions, 2);
  EXPECT_EQ(stats.fused_post_ops, 1);  // the relu; not the add
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) {
    ops.push_back(n.op());
    if (n.op() == "mkldnn::_convolution_pointwise") {
      const auto& m = n.outputs(0).meta();
      EXPECT_EQ(std::vector<int64_t>(m.strides().begin(), m.strides().end()),
                (std::vector<int64_t>{144, 1, 24, 4}));
    }
    if (n.op() == "aten::clone") {
      const auto& m = n.outputs(0).meta();
      EXPECT_EQ(std::vector<int64_t>(m.strides().begin(), m.strides().end()),
                (std::vector<int64_t>{144, 36, 6, 1}));
    }
  }
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::clone"), 2);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::add.Tensor"), 1);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::relu"), 0);
  // The relu's value is the first copy's result, as the graph returns it.
  bool relu_copied = false;
  for (const auto& n : g.nodes()) {
    relu_copied = relu_copied || (n.op() == "aten::clone" && n.outputs(0).id() == relu);
  }
  EXPECT_TRUE(relu_copied);
}

TEST(OneDnnPassesTest, ParameterWeightsOfMatrixProductsArePackedOnce) {
  GraphBuilder b;
  uint32_t w = b.Input({16, 32});
  b.Bound(1);
  uint32_t x = b.Input({8, 32});
  uint32_t wt = b.Op("aten::permute", {V(w), Ints({1, 0})}, {32, 16}, kF32, {1, 32});
  b.Output(b.Op("aten::mm", {V(x), V(wt)}, {8, 16}));
  PassStats stats;
  Graph g = EliminateDeadCode(UseOneDnnLinear(b.graph(), &stats));
  EXPECT_EQ(stats.packed_linears, 1);
  ASSERT_EQ(Ops(g), (std::vector<std::string>{"mkldnn::_reorder_linear_weight",
                                              "mkldnn::_linear_pointwise"}));
  EXPECT_EQ(g.nodes(0).args(0).value(), w);
  EXPECT_EQ(g.nodes(0).args(1).int_value(), 8);  // packed for the batch size
  EXPECT_TRUE(BoundValues(g).count(g.nodes(0).outputs(0).id()));
}

TEST(CpuKernelTest, InvalidIsaIsRefusedWithoutRunningTheToolchain) {
  GraphBuilder b;
  uint32_t x = b.Input({4});
  b.Output(b.Op("aten::neg", {V(x)}, {4}));
  kiln::v1::CompileRequest request = b.Request();
  request.mutable_target()->set_cpu_isa("native");
  CpuCompiler compiler(CpuCompilerOptions{"/nonexistent/g++"});
  auto body = compiler.Compile(request);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(CompileErrorFromStatus(body.status()).code(),
            kiln::v1::CompileError::CODE_UNIMPLEMENTED);
}

}  // namespace
}  // namespace kiln::compiler
