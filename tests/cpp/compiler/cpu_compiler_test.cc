// CpuCompiler against the real host compiler: fusion structure, the generated kernel run through
// dlopen on hand-made buffers, buffer planning, and structured errors for what it cannot build.
#include "compiler/cpu_compiler.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "compiler/codegen/cpu/kernel_abi_text.h"
#include "compiler/passes/fusion.h"
#include "compiler/passes/memory_plan.h"
#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/kernel_abi.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::compiler {
namespace {

using kiln::testing::MakeRequest;
using kiln::testing::SetContiguous;

kiln::v1::Node* AddNode(kiln::v1::Graph* g, const std::string& op, std::vector<uint32_t> args,
                        uint32_t out, std::initializer_list<int64_t> sizes) {
  kiln::v1::Node* n = g->add_nodes();
  n->set_op(op);
  for (uint32_t a : args) n->add_args()->set_value(a);
  kiln::v1::Value* v = n->add_outputs();
  v->set_id(out);
  SetContiguous(v->mutable_meta(), sizes);
  return n;
}

TEST(CpuCompilerTest, PointwiseChainIsOneKernelThatComputesTheGraph) {
  CpuCompiler compiler;
  auto body = compiler.Compile(MakeRequest(0));  // relu(x + x) over [4, 4]
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->format(), kiln::v1::BINARY_FORMAT_ELF_SHARED_OBJECT);
  ASSERT_EQ(body->plan().steps_size(), 1);
  const auto& launch = body->plan().steps(0).kernel();
  ASSERT_EQ(launch.args_size(), 2);  // input, output
  EXPECT_EQ(launch.writes(0), 2u);

  kiln::testing::TempDir dir;
  std::string path = dir.path() + "/k.so";
  std::ofstream(path, std::ios::binary) << body->kernel_binary();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto fn = reinterpret_cast<kiln_kernel_fn>(dlsym(handle, launch.symbol().c_str()));
  ASSERT_NE(fn, nullptr);
  std::vector<float> x(16), out(16, -1.f);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) - 7.5f;
  void* args[] = {x.data(), out.data()};
  fn(args, &kiln::testing::ChunkedParallelFor);
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(out[i], std::max(0.f, 2 * x[i])) << i;
  dlclose(handle);
}

// Repeated layers' kernels are one function in the shared object: both layers' pointwise steps
// call it, and it computes each one's own operands.
TEST(CpuCompilerTest, RepeatedLayersCallOneFunctionPerDistinctKernel) {
  CpuCompiler compiler;
  auto body = compiler.Compile(kiln::testing::RepeatedLayers(3).Request());
  ASSERT_TRUE(body.ok()) << body.status();
  std::vector<const kiln::v1::KernelLaunch*> launches;
  for (const auto& step : body->plan().steps()) {
    if (step.has_kernel()) launches.push_back(&step.kernel());
  }
  ASSERT_EQ(launches.size(), 7u) << body->kernel_source();
  for (int layer = 1; layer < 3; ++layer) {
    EXPECT_EQ(launches[2 * layer]->symbol(), launches[0]->symbol());
    EXPECT_EQ(launches[2 * layer + 1]->symbol(), launches[1]->symbol());
  }
  EXPECT_NE(launches[6]->symbol(), launches[0]->symbol());
  const std::string& src = body->kernel_source();
  size_t functions = 0;
  for (size_t at = src.find("extern \"C\" void kiln_kernel_"); at != std::string::npos;
       at = src.find("extern \"C\" void kiln_kernel_", at + 1)) {
    ++functions;
  }
  EXPECT_EQ(functions, 3u) << src;

  kiln::testing::TempDir dir;
  std::string path = dir.path() + "/k.so";
  std::ofstream(path, std::ios::binary) << body->kernel_binary();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  for (const kiln::v1::KernelLaunch* k : launches) {
    EXPECT_NE(dlsym(handle, k->symbol().c_str()), nullptr) << k->symbol();
  }
  // gelu(s + bias) over [64, 256] through the shared function, on two operand sets.
  auto fn = reinterpret_cast<kiln_kernel_fn>(dlsym(handle, launches[2]->symbol().c_str()));
  ASSERT_NE(fn, nullptr);
  ASSERT_EQ(launches[2]->args_size(), 3);
  for (float scale : {1.f, -0.5f}) {
    std::vector<float> s(64 * 256), bias(256), out(64 * 256, 0.f);
    for (size_t i = 0; i < s.size(); ++i) s[i] = scale * (static_cast<float>(i % 97) / 24.f - 2.f);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i % 7) / 7.f;
    void* args[] = {s.data(), bias.data(), out.data()};
    fn(args, &kiln::testing::ChunkedParallelFor);
    for (size_t i = 0; i < out.size(); i += 61) {
      const double v = s[i] + bias[i % 256];
      EXPECT_NEAR(out[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-5) << i;
    }
  }
  dlclose(handle);
}

TEST(CpuCompilerTest, KernelSourceCarriesTheKernelAbiVerbatimAndIncludesNoKilnHeader) {
  std::ifstream in(KILN_KERNEL_ABI_H);
  const std::string header((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(header.find("typedef void (*kiln_kernel_fn)"), std::string::npos);
  EXPECT_EQ(header, kKernelAbiHeader);  // The embedded text is the header's, not a stale copy.

  CpuCompiler compiler;
  auto body = compiler.Compile(MakeRequest(0));
  ASSERT_TRUE(body.ok()) << body.status();
  const std::string& source = body->kernel_source();
  EXPECT_NE(source.find(header), std::string::npos);
  EXPECT_EQ(source.find("#include \""), std::string::npos) << "kernels build without kiln headers";
  // The kernel is defined with the ABI's own types.
  EXPECT_NE(source.find("(void* const* args, kiln_parallel_for_fn"), std::string::npos);
}

TEST(CpuCompilerTest, BroadcastOperandReadsWithZeroStrides) {
  kiln::v1::CompileRequest request;
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
  auto* g = request.mutable_graph();
  auto* x = g->add_inputs();
  x->set_id(0);
  SetContiguous(x->mutable_meta(), {3, 5});
  auto* b = g->add_inputs();
  b->set_id(1);
  SetContiguous(b->mutable_meta(), {5});
  AddNode(g, "aten::mul.Tensor", {0, 1}, 2, {3, 5});
  g->add_outputs(2);
  FusedProgram program = FuseGraph(*g);
  ASSERT_EQ(program.groups.size(), 1u);
  ASSERT_EQ(program.groups[0].inputs.size(), 2u);
  EXPECT_EQ(program.groups[0].inputs[1].strides, (std::vector<int64_t>{0, 1}));

  CpuCompiler compiler;
  auto body = compiler.Compile(request);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_NE(body->kernel_source().find("i0 * 5"), std::string::npos) << body->kernel_source();
}

TEST(CpuCompilerTest, LibraryCallsSplitGroupsAndIntermediatesBecomeBuffers) {
  // y = exp(x); z = mm(y, y); out = relu(z) + y  -> kernel, library, kernel; y is read after
  // the first kernel, so it is a buffer; outputs are never in the arena.
  kiln::v1::CompileRequest request;
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
  auto* g = request.mutable_graph();
  auto* x = g->add_inputs();
  x->set_id(0);
  SetContiguous(x->mutable_meta(), {4, 4});
  AddNode(g, "aten::exp", {0}, 1, {4, 4});
  AddNode(g, "aten::mm", {1, 1}, 2, {4, 4});
  AddNode(g, "aten::relu", {2}, 3, {4, 4});
  AddNode(g, "aten::add.Tensor", {3, 1}, 4, {4, 4});
  g->add_outputs(4);
  FusedProgram program = FuseGraph(*g);
  ASSERT_EQ(program.steps.size(), 3u);
  EXPECT_TRUE(program.steps[0].is_kernel);
  EXPECT_FALSE(program.steps[1].is_kernel);
  EXPECT_TRUE(program.steps[2].is_kernel);
  kiln::v1::ExecutionPlan plan = BuildPlan(*g, program);
  ASSERT_EQ(plan.buffers_size(), 2);
  EXPECT_EQ(plan.buffers(0).id(), 1u);
  EXPECT_TRUE(plan.buffers(0).in_arena());
  EXPECT_EQ(plan.buffers(1).id(), 4u);
  EXPECT_FALSE(plan.buffers(1).in_arena());
  EXPECT_GE(plan.arena_bytes(), 64u);
  // The mm result is released after its last reader, the final kernel.
  ASSERT_EQ(plan.steps(2).release_size(), 1);
  EXPECT_EQ(plan.steps(2).release(0), 2u);
}

TEST(CpuCompilerTest, ArenaBuffersWithOverlappingLifetimesDoNotShareBytes) {
  // a = exp(x) [kernel 1], m1 = mm(a, a) [lib], b = exp(m1) [kernel 2], m2 = mm(a, b) [lib]:
  // a and b are both live at the second mm.
  kiln::v1::Graph graph;
  kiln::v1::Graph* g = &graph;
  auto* x = g->add_inputs();
  x->set_id(0);
  SetContiguous(x->mutable_meta(), {8, 8});
  AddNode(g, "aten::exp", {0}, 1, {8, 8});
  AddNode(g, "aten::mm", {1, 1}, 2, {8, 8});
  AddNode(g, "aten::exp", {2}, 3, {8, 8});
  AddNode(g, "aten::mm", {1, 3}, 4, {8, 8});
  g->add_outputs(4);
  kiln::v1::ExecutionPlan plan = BuildPlan(*g, FuseGraph(*g));
  ASSERT_EQ(plan.buffers_size(), 2);
  ASSERT_TRUE(plan.buffers(0).in_arena() && plan.buffers(1).in_arena());
  uint64_t a = plan.buffers(0).arena_offset(), b = plan.buffers(1).arena_offset();
  EXPECT_TRUE(a + 256 <= b || b + 256 <= a) << a << " " << b;
  EXPECT_GE(plan.arena_bytes(), 512u);
}

TEST(CpuCompilerTest, DeadNodesAreDropped) {
  kiln::v1::CompileRequest request = MakeRequest(1);
  auto* g = request.mutable_graph();
  AddNode(g, "aten::mm", {0, 0}, 7, {4, 4});  // nobody reads it (shape is irrelevant here)
  FusedProgram program = FuseGraph(*g);
  for (const FusedStep& s : program.steps) EXPECT_TRUE(s.is_kernel);
}

TEST(CpuCompilerTest, PointwiseNodeMissingAnOperandIsALibraryCallNotAKernel) {
  kiln::v1::CompileRequest request = MakeRequest(1);
  auto* g = request.mutable_graph();
  g->clear_nodes();
  g->clear_outputs();
  AddNode(g, "aten::mul.Tensor", {0}, 1, {4, 5});  // "other" missing: what would it multiply by?
  g->add_outputs(1);
  FusedProgram program = FuseGraph(*g);
  ASSERT_EQ(program.steps.size(), 1u);
  EXPECT_FALSE(program.steps[0].is_kernel);
  auto generated = GenerateCpu(request);
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_TRUE(generated->source.empty());
}

TEST(CpuCompilerTest, CudaTargetIsUnimplemented) {
  CpuCompiler compiler;
  kiln::v1::CompileRequest request = MakeRequest();
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CUDA);
  request.mutable_target()->set_cpu_isa("");
  request.mutable_target()->set_cuda_arch("sm_90");
  auto body = compiler.Compile(request);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(CompileErrorFromStatus(body.status()).code(),
            kiln::v1::CompileError::CODE_UNIMPLEMENTED);
}

TEST(CpuCompilerTest, FailingToolchainIsAStructuredError) {
  CpuCompiler compiler(CpuCompilerOptions{"/bin/false", std::chrono::seconds(30)});
  auto body = compiler.Compile(MakeRequest());
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(CompileErrorFromStatus(body.status()).code(), kiln::v1::CompileError::CODE_TOOLCHAIN);
}

TEST(CpuCompilerTest, UnknownIsaIsRefusedBeforeAnyCommandLine) {
  CpuCompiler compiler;
  kiln::v1::CompileRequest request = MakeRequest();
  request.mutable_target()->set_cpu_isa("native -o /tmp/x");
  auto body = compiler.Compile(request);
  ASSERT_FALSE(body.ok());
  EXPECT_NE(CompileErrorFromStatus(body.status()).message().find("cpu_isa"), std::string::npos);
}

TEST(CpuCompilerTest, VersionNamesTheToolchain) {
  CpuCompiler compiler;
  EXPECT_NE(compiler.Version().find("kiln-cpu-"), std::string::npos);
  EXPECT_NE(compiler.Version().find("-O3"), std::string::npos);
  EXPECT_NE(compiler.Version(), CpuCompiler(CpuCompilerOptions{"/bin/false"}).Version());
}

}  // namespace
}  // namespace kiln::compiler
