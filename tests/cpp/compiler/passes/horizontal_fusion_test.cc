// Horizontal fusion in the CPU compiler: independent pointwise chains over one iteration space
// become one kernel with several outputs when no other step lies on a path between them, and the
// merged kernels compute what the separate ones did.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/cpu_compiler.h"
#include "compiler/passes/bound_prologue.h"
#include "compiler/passes/fusion.h"
#include "compiler/passes/memory_plan.h"
#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/kernel_abi.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::compiler {
namespace {

using kiln::testing::B;
using kiln::testing::F;
using kiln::testing::GraphBuilder;
using kiln::testing::I;
using kiln::testing::Ints;
using kiln::testing::Iota;
using kiln::testing::V;
using Ids = std::set<uint32_t>;

// The values each kernel step computes, in step order.
std::vector<Ids> KernelValues(const kiln::v1::Graph& graph, const FusedProgram& program) {
  std::vector<Ids> kernels;
  for (const FusedStep& step : program.steps) {
    if (!step.is_kernel) continue;
    Ids values;
    for (int i : program.groups[step.group].nodes) values.insert(graph.nodes(i).outputs(0).id());
    kernels.push_back(values);
  }
  return kernels;
}

// Each step as "kernel" or the library op it calls.
std::vector<std::string> StepNames(const kiln::v1::Graph& graph, const FusedProgram& program) {
  std::vector<std::string> names;
  for (const FusedStep& step : program.steps) {
    names.push_back(step.is_kernel ? "kernel" : graph.nodes(step.node).op());
  }
  return names;
}

// Runs kernel step `step` of a compiled artifact on memory the test owns (value id -> data).
void RunKernelStep(const kiln::v1::ArtifactBody& body, const kiln::v1::PlanStep& step,
                   const std::map<uint32_t, void*>& data) {
  ASSERT_TRUE(step.has_kernel());
  kiln::testing::TempDir dir;
  const std::string path = dir.Sub("kernels.so");
  std::ofstream(path, std::ios::binary) << body.kernel_binary();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto fn = reinterpret_cast<kiln_kernel_fn>(dlsym(handle, step.kernel().symbol().c_str()));
  ASSERT_NE(fn, nullptr) << step.kernel().symbol();
  std::vector<void*> args;
  for (uint32_t id : step.kernel().args()) {
    ASSERT_TRUE(data.count(id)) << "no memory for value " << id;
    args.push_back(data.at(id));
  }
  fn(args.data(), &kiln::testing::ChunkedParallelFor);
  dlclose(handle);
}

// ---------------------------------------------------------------------------------------------
// What merges.

TEST(HorizontalFusionTest, ChainsSharingAnInputAreOneKernelWhetherAdjacentOrNot) {
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  // Adjacent in the graph: sin(x), cos(x), both returned.
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(x)}, {8, 8});
  // Split by the library call reading the first: y = x * 2 -> mm, z = x + 1 -> mm.
  uint32_t y = b.Op("aten::mul.Tensor", {V(x), F(2)}, {8, 8});
  uint32_t my = b.Op("aten::mm", {V(y), V(y)}, {8, 8});
  uint32_t z = b.Op("aten::add.Tensor", {V(x), F(1)}, {8, 8});
  uint32_t mz = b.Op("aten::mm", {V(z), V(z)}, {8, 8});
  for (uint32_t out : {s, c, my, mz}) b.Output(out);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s, c, y, z}}));
  EXPECT_EQ(StepNames(b.graph(), program),
            (std::vector<std::string>{"kernel", "aten::mm", "aten::mm"}));
  const FusedGroup& g = program.groups[program.steps[0].group];
  EXPECT_EQ(g.input_ids, std::vector<uint32_t>{x});  // x is loaded once
  EXPECT_EQ(Ids(g.outputs.begin(), g.outputs.end()), (Ids{s, c, y, z}));
}

TEST(HorizontalFusionTest, ChainsSharingNoInputAreOneKernel) {
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t y = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t ms = b.Op("aten::mm", {V(s), V(s)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(y)}, {8, 8});
  uint32_t mc = b.Op("aten::mm", {V(c), V(c)}, {8, 8});
  b.Output(ms);
  b.Output(mc);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s, c}}));
  EXPECT_EQ(StepNames(b.graph(), program),
            (std::vector<std::string>{"kernel", "aten::mm", "aten::mm"}));
}

TEST(HorizontalFusionTest, DifferentIterationSpacesStayApart) {
  // A per-channel [C] chain between two [N, C, H, W] chains: the two of the large space merge
  // around it, the small one stays a kernel of its own.
  GraphBuilder b;
  uint32_t x = b.Input({2, 4, 3, 3});
  uint32_t v = b.Input({4});
  uint32_t r = b.Op("aten::relu", {V(x)}, {2, 4, 3, 3});
  uint32_t e = b.Op("aten::exp", {V(v)}, {4});
  uint32_t s = b.Op("aten::sigmoid", {V(x)}, {2, 4, 3, 3});
  for (uint32_t out : {r, e, s}) b.Output(out);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{r, s}, {e}}));
}

TEST(HorizontalFusionTest, MergedKernelRunsAfterTheLibraryCallFeedingTheLaterChain) {
  // sin(x) | exp(v) over another space | w @ w | cos(w @ w): the cos chain needs the product, so
  // the merged kernel runs after it.
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t v = b.Input({4});
  uint32_t w = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t e = b.Op("aten::exp", {V(v)}, {4});
  uint32_t m = b.Op("aten::mm", {V(w), V(w)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(m)}, {8, 8});
  for (uint32_t out : {s, e, c}) b.Output(out);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(StepNames(b.graph(), program),
            (std::vector<std::string>{"aten::mm", "kernel", "kernel"}));
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s, c}, {e}}));
}

TEST(HorizontalFusionTest, StepsTheLaterChainNeedsMoveAheadOfTheMergedKernel) {
  // sin(x) -> s @ s; w @ w -> cos: the second product moves ahead of the merged kernel, the
  // first stays after it. (Q, K and V projections with their bias adds have this shape.)
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t w = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t ms = b.Op("aten::mm", {V(s), V(s)}, {8, 8});
  uint32_t mw = b.Op("aten::mm", {V(w), V(w)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(mw)}, {8, 8});
  b.Output(ms);
  b.Output(c);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s, c}}));
  ASSERT_EQ(program.steps.size(), 3u);
  EXPECT_EQ(b.graph().nodes(program.steps[0].node).outputs(0).id(), mw);
  EXPECT_TRUE(program.steps[1].is_kernel);
  EXPECT_EQ(b.graph().nodes(program.steps[2].node).outputs(0).id(), ms);
}

TEST(HorizontalFusionTest, KernelJoinsTheEarlierKernelSharingItsInputs) {
  // k1 = sin(x) -> mm -> k2 = cos(mm) + y -> mm; k3 = exp(x). k3 may join k1 or k2 and joins
  // k1, whose input it shares.
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t y = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t m1 = b.Op("aten::mm", {V(s), V(s)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(m1)}, {8, 8});
  uint32_t a = b.Op("aten::add.Tensor", {V(c), V(y)}, {8, 8});
  uint32_t m2 = b.Op("aten::mm", {V(a), V(a)}, {8, 8});
  uint32_t e = b.Op("aten::exp", {V(x)}, {8, 8});
  b.Output(m2);
  b.Output(e);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s, e}, {c, a}}));
}

TEST(HorizontalFusionTest, IndependentRowWiseGroupsOfOneShapeMerge) {
  // softmax(x) -> mm; softmax(y) -> mm.
  GraphBuilder b;
  uint32_t x = b.Input({64, 16});
  uint32_t y = b.Input({64, 16});
  uint32_t w = b.Input({16, 16});
  std::vector<uint32_t> probs;
  for (uint32_t in : {x, y}) {
    uint32_t mx = b.Op("aten::amax", {V(in), Ints({1}), B(true)}, {64, 1});
    uint32_t d = b.Op("aten::sub.Tensor", {V(in), V(mx)}, {64, 16});
    uint32_t e = b.Op("aten::exp", {V(d)}, {64, 16});
    uint32_t z = b.Op("aten::sum.dim_IntList", {V(e), Ints({-1}), B(true)}, {64, 1});
    probs.push_back(b.Op("aten::div.Tensor", {V(e), V(z)}, {64, 16}));
    b.Output(b.Op("aten::mm", {V(probs.back()), V(w)}, {64, 16}));
  }
  FusedProgram program = FuseGraph(b.graph());
  ASSERT_EQ(KernelValues(b.graph(), program).size(), 1u);
  const FusedGroup& g = program.groups[program.steps[0].group];
  EXPECT_EQ(g.outer_rank, 1);
  EXPECT_EQ(g.nodes.size(), 10u);
  EXPECT_EQ(g.outputs, probs);

  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_TRUE(body->plan().steps(0).has_kernel());
  std::vector<float> xs = Iota(64 * 16, -5.f, 0.013f), ys = Iota(64 * 16, 7.f, -0.021f);
  std::vector<float> px(64 * 16, -1.f), py(64 * 16, -1.f);
  RunKernelStep(*body, body->plan().steps(0),
                {{x, xs.data()}, {y, ys.data()}, {probs[0], px.data()}, {probs[1], py.data()}});
  for (auto [in, got] : {std::pair{&xs, &px}, std::pair{&ys, &py}}) {
    for (int r = 0; r < 64; ++r) {
      float mx = -INFINITY, sum = 0;
      for (int i = 0; i < 16; ++i) mx = std::max(mx, (*in)[r * 16 + i]);
      for (int i = 0; i < 16; ++i) sum += std::exp((*in)[r * 16 + i] - mx);
      for (int i = 0; i < 16; ++i) {
        ASSERT_NEAR((*got)[r * 16 + i], std::exp((*in)[r * 16 + i] - mx) / sum, 1e-6) << r;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// What does not merge.

TEST(HorizontalFusionTest, ChainReadingALibraryResultOfTheOtherChainIsNotMerged) {
  // y = x * 2 -> mm(y, y) -> z = mm + 1: z depends on y through the library call.
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t y = b.Op("aten::mul.Tensor", {V(x), F(2)}, {8, 8});
  uint32_t m = b.Op("aten::mm", {V(y), V(y)}, {8, 8});
  uint32_t z = b.Op("aten::add.Tensor", {V(m), F(1)}, {8, 8});
  b.Output(z);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{y}, {z}}));
  EXPECT_EQ(StepNames(b.graph(), program),
            (std::vector<std::string>{"kernel", "aten::mm", "kernel"}));
}

TEST(HorizontalFusionTest, ChainReadingAViewOfTheOtherChainIsNotMerged) {
  // c = cos(exp(x).t()): one kernel would read exp(x) transposed while writing it.
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t e = b.Op("aten::exp", {V(x)}, {8, 8});
  uint32_t t = b.Op("aten::t", {V(e)}, {8, 8}, kiln::v1::DTYPE_FLOAT32, {1, 8});
  uint32_t c = b.Op("aten::cos", {V(t)}, {8, 8});
  b.Output(c);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{e}, {c}}));
  EXPECT_EQ(program.groups[1].inputs[0].base, e);  // the view is folded into the read
}

TEST(HorizontalFusionTest, RandomOpsKeepTheirOrder) {
  // sin(x) -> rand_like; then rand_like(w) -> cos: a merged kernel would need the second draw
  // before the first.
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t w = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t rs = b.Op("aten::rand_like", {V(s)}, {8, 8});
  uint32_t rw = b.Op("aten::rand_like", {V(w)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(rw)}, {8, 8});
  b.Output(rs);
  b.Output(c);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s}, {c}}));
  ASSERT_EQ(program.steps.size(), 4u);
  EXPECT_EQ(program.steps[1].node, 1);  // rand_like(s)
  EXPECT_EQ(program.steps[2].node, 2);  // rand_like(w)
}

TEST(HorizontalFusionTest, OutputsOfDifferentLayoutsStayApart) {
  GraphBuilder b;
  uint32_t x = b.Input({8, 8});
  uint32_t xt = b.Input({8, 8}, kiln::v1::DTYPE_FLOAT32, {1, 8});
  uint32_t s = b.Op("aten::sin", {V(x)}, {8, 8});
  uint32_t ms = b.Op("aten::mm", {V(s), V(s)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(xt)}, {8, 8}, kiln::v1::DTYPE_FLOAT32, {1, 8});
  b.Output(ms);
  b.Output(c);
  FusedProgram program = FuseGraph(b.graph());
  EXPECT_EQ(KernelValues(b.graph(), program), (std::vector<Ids>{{s}, {c}}));
}

TEST(HorizontalFusionTest, PrologueWorkIsLibraryStepsAndNeverJoinsAPerCallKernel) {
  // sin(p) depends on the parameter p only (prologue), cos(x) on the input; both feed mm. The
  // prologue runs once per parameter version: ATen computes it, no kernel is generated for it.
  GraphBuilder b;
  uint32_t p = b.Input({8, 8});
  b.Bound(1);
  uint32_t x = b.Input({8, 8});
  uint32_t s = b.Op("aten::sin", {V(p)}, {8, 8});
  uint32_t c = b.Op("aten::cos", {V(x)}, {8, 8});
  uint32_t m = b.Op("aten::mm", {V(s), V(c)}, {8, 8});
  b.Output(m);
  const auto bound = BoundValues(b.graph());
  const kiln::v1::Graph g = BoundNodesFirst(b.graph(), bound);
  FusedProgram program = FuseGraph(g, &bound);
  EXPECT_EQ(KernelValues(g, program), (std::vector<Ids>{{c}}));
  kiln::v1::ExecutionPlan plan = BuildPlan(g, program, &bound);
  ASSERT_EQ(plan.prologue_size(), 1);
  EXPECT_EQ(plan.prologue(0).library().op(), "aten::sin");
  ASSERT_EQ(plan.steps_size(), 2);
  EXPECT_EQ(std::vector<uint32_t>(plan.steps(0).kernel().writes().begin(),
                                  plan.steps(0).kernel().writes().end()),
            std::vector<uint32_t>{c});
}

// ---------------------------------------------------------------------------------------------
// Merged kernels run.

TEST(HorizontalFusionTest, MergedKernelComputesEveryChain) {
  // Large enough for the parallel loop: [256, 160] = 40960 elements. x * 2 + y and x + 1, each
  // read by its own product, with sin(y) returned; three chains, one kernel.
  constexpr int R = 256, C = 160;
  GraphBuilder b;
  uint32_t x = b.Input({R, C});
  uint32_t y = b.Input({R, C});
  uint32_t w = b.Input({C, 8});
  uint32_t u = b.Op("aten::mul.Tensor", {V(x), F(2)}, {R, C});
  uint32_t uy = b.Op("aten::add.Tensor", {V(u), V(y)}, {R, C});
  uint32_t m1 = b.Op("aten::mm", {V(uy), V(w)}, {R, 8});
  uint32_t z = b.Op("aten::add.Tensor", {V(x), I(1)}, {R, C});
  uint32_t m2 = b.Op("aten::mm", {V(z), V(w)}, {R, 8});
  uint32_t s = b.Op("aten::sin", {V(y)}, {R, C});
  for (uint32_t out : {m1, m2, s}) b.Output(out);
  CpuCompiler compiler;
  auto body = compiler.Compile(b.Request());
  ASSERT_TRUE(body.ok()) << body.status();
  const auto& plan = body->plan();
  ASSERT_EQ(plan.steps_size(), 3);
  ASSERT_TRUE(plan.steps(0).has_kernel());
  EXPECT_EQ(plan.steps(1).library().op(), "aten::mm");
  EXPECT_EQ(plan.steps(2).library().op(), "aten::mm");
  const auto& k = plan.steps(0).kernel();
  EXPECT_EQ(std::vector<uint32_t>(k.args().begin(), k.args().end()),
            (std::vector<uint32_t>{x, y, uy, z, s}));
  EXPECT_NE(body->kernel_source().find("kiln_parallel_for(0, "), std::string::npos);
  std::vector<float> xs = Iota(R * C, -3.f, 1.5e-4f), ys = Iota(R * C, 2.f, -1e-4f);
  std::vector<float> uys(R * C, NAN), zs(R * C, NAN), ss(R * C, NAN);
  RunKernelStep(*body, plan.steps(0),
                {{x, xs.data()}, {y, ys.data()}, {uy, uys.data()}, {z, zs.data()}, {s, ss.data()}});
  for (int i = 0; i < R * C; ++i) {
    ASSERT_FLOAT_EQ(uys[i], xs[i] * 2 + ys[i]) << i;
    ASSERT_FLOAT_EQ(zs[i], xs[i] + 1) << i;
    ASSERT_NEAR(ss[i], std::sin(ys[i]), 1e-6) << i;
  }
}

}  // namespace
}  // namespace kiln::compiler
