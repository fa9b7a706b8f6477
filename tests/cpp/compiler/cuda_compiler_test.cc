// CudaCompiler without a GPU: every kind of generated kernel is built by NVRTC for sm_90 and its
// cubin checked (the kernels the plan launches, their registers, stack frame and shared memory);
// launch configurations cover the iteration space; the target rules and errors.
#include "compiler/cuda_compiler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/codegen/cuda/cuda_codegen.h"
#include "compiler/cpu_compiler.h"
#include "compiler/passes/cuda_library_passes.h"
#include "compiler/passes/fusion.h"
#include "compiler/target_compiler.h"
#include "tests/cpp/support/cubin_reader.h"
#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/nvrtc_for_tests.h"
#include "tests/cpp/support/symbolic_meta.h"

namespace kiln::compiler {
namespace {

using kiln::testing::AddSizeSymbols;
using kiln::testing::B;
using kiln::testing::F;
using kiln::testing::GraphBuilder;
using kiln::testing::I;
using kiln::testing::Ints;
using kiln::testing::Named;
using kiln::testing::None;
using kiln::testing::SetSymbolic;
using kiln::testing::Term;
using kiln::testing::V;
constexpr kiln::v1::DType kF32 = kiln::v1::DTYPE_FLOAT32;
constexpr kiln::v1::DType kBF16 = kiln::v1::DTYPE_BFLOAT16;
constexpr kiln::v1::DType kF16 = kiln::v1::DTYPE_FLOAT16;
constexpr kiln::v1::DType kI64 = kiln::v1::DTYPE_INT64;
constexpr kiln::v1::DType kBool = kiln::v1::DTYPE_BOOL;

void ToCuda(kiln::v1::TensorMeta* m) { m->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CUDA); }

// The builder's graph with every tensor on cuda:0, for an sm_90 target.
kiln::v1::CompileRequest CudaRequest(const GraphBuilder& b, const std::string& arch = "sm_90") {
  kiln::v1::CompileRequest request = b.Request();
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CUDA);
  request.mutable_target()->set_cuda_arch(arch);
  kiln::v1::Graph* g = request.mutable_graph();
  for (auto& v : *g->mutable_inputs()) ToCuda(v.mutable_meta());
  for (auto& c : *g->mutable_constants()) ToCuda(c.mutable_value()->mutable_meta());
  for (auto& n : *g->mutable_nodes()) {
    for (auto& v : *n.mutable_outputs()) ToCuda(v.mutable_meta());
  }
  return request;
}

std::vector<const kiln::v1::KernelLaunch*> Launches(const kiln::v1::ExecutionPlan& plan) {
  std::vector<const kiln::v1::KernelLaunch*> out;
  for (const auto* list : {&plan.prologue(), &plan.steps()}) {
    for (const auto& s : *list) {
      if (s.has_kernel()) out.push_back(&s.kernel());
    }
  }
  return out;
}

int64_t Threads(const kiln::v1::KernelLaunch& k) {
  int64_t n = 1;
  for (uint32_t g : k.grid()) n *= g;
  for (uint32_t b : k.block()) n *= b;
  return n;
}

// Compiles `request` with NVRTC, checks the artifact and the cubin of every kernel it launches,
// and returns the body (with `cubin` the parsed binary).
class CudaKernelTest : public ::testing::Test {
 protected:
  kiln::v1::ArtifactBody Build(const kiln::v1::CompileRequest& request, kiln::testing::Cubin* out) {
    std::string why;
    auto nvrtc = kiln::testing::LoadNvrtcForTests(&why);
    if (nvrtc == nullptr) {
      if (!kiln::testing::NvrtcRequired()) {
        skipped_ = true;
        return {};
      }
      ADD_FAILURE() << why << " (set KILN_NVRTC, or KILN_NVRTC_REQUIRED=0 to skip)";
      return {};
    }
    CudaCompiler compiler{std::move(nvrtc)};
    absl::StatusOr<kiln::v1::ArtifactBody> body = compiler.Compile(request);
    EXPECT_TRUE(body.ok()) << body.status();
    if (!body.ok()) return {};
    EXPECT_EQ(body->format(), kiln::v1::BINARY_FORMAT_CUBIN);
    EXPECT_NE(body->kernel_ptx().find(".target sm_90"), std::string::npos);
    std::optional<kiln::testing::Cubin> cubin = kiln::testing::ReadCubin(body->kernel_binary());
    EXPECT_TRUE(cubin.has_value()) << "kernel_binary is no ELF";
    if (!cubin) return *body;
    EXPECT_EQ(cubin->machine, 190);  // EM_CUDA
    EXPECT_EQ(cubin->sm, 90);
    for (const kiln::v1::KernelLaunch* k : Launches(body->plan())) {
      auto it = cubin->kernels.find(k->symbol());
      EXPECT_NE(it, cubin->kernels.end()) << k->symbol() << " is not in the cubin";
      if (it == cubin->kernels.end()) continue;
      const kiln::testing::CubinKernel& r = it->second;
      EXPECT_GT(r.registers, 0) << k->symbol();
      EXPECT_LE(r.registers, 255) << k->symbol();
      EXPECT_EQ(k->block_size(), 3);
      if (k->block_size() != 3) continue;
      const int64_t threads = int64_t{k->block(0)} * k->block(1) * k->block(2);
      // A block's threads must fit the register file (64K registers per SM).
      EXPECT_LE(int64_t{r.registers} * threads, 65536) << k->symbol();
      EXPECT_EQ(r.frame_bytes, 0) << k->symbol() << " spills or uses local memory";
      EXPECT_LE(r.shared_bytes + k->shared_memory_bytes(), 48 * 1024) << k->symbol();
      EXPECT_EQ(k->grid_size(), 3);
      EXPECT_EQ(k->block(0) % 32, 0u);
      EXPECT_EQ(r.max_threads, static_cast<int>(threads)) << "__launch_bounds__ is the block";
      EXPECT_GE(k->grid(0), 1u);
      resources_.push_back({k->symbol(), r});
      RecordProperty(k->symbol() + "_registers", r.registers);
      RecordProperty(k->symbol() + "_shared_bytes", static_cast<int>(r.shared_bytes));
    }
    if (out != nullptr) *out = *cubin;
    return *body;
  }

  void TearDown() override {
    for (const auto& [symbol, r] : resources_) {
      std::printf("  %s: %d registers, %lld bytes static shared, %lld bytes frame\n",
                  symbol.c_str(), r.registers, static_cast<long long>(r.shared_bytes),
                  static_cast<long long>(r.frame_bytes));
    }
  }

  bool skipped_ = false;
  std::vector<std::pair<std::string, kiln::testing::CubinKernel>> resources_;
};

#define KILN_SKIP_IF_NO_NVRTC() \
  if (skipped_) GTEST_SKIP() << "SKIPPED: no NVRTC and KILN_NVRTC_REQUIRED=0"

// gelu(x * y + 1) over [64, 1024]: one kernel, vectorized (16 bytes of the widest operand).
GraphBuilder PointwiseChain(kiln::v1::DType dtype, std::vector<int64_t> sizes = {64, 1024}) {
  GraphBuilder b;
  uint32_t x = b.Input(sizes, dtype), y = b.Input(sizes, dtype);
  uint32_t m = b.Op("aten::mul.Tensor", {V(x), V(y)}, sizes, dtype);
  uint32_t a = b.Op("aten::add.Scalar", {V(m), F(1.0)}, sizes, dtype);
  uint32_t g = b.Op("aten::gelu", {V(a)}, sizes, dtype);
  b.Output(g);
  return b;
}

TEST_F(CudaKernelTest, PointwiseFloat32IsOneVectorizedKernelCoveringTheSpace) {
  auto body = Build(CudaRequest(PointwiseChain(kF32)), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u);
  const auto& k = *Launches(body.plan())[0];
  EXPECT_EQ(k.args_size(), 3);
  EXPECT_NE(body.kernel_source().find("kiln_vec<float, 4>"), std::string::npos);
  EXPECT_NE(body.kernel_source().find("kiln_aligned"), std::string::npos);
  EXPECT_GE(Threads(k) * 4, 64 * 1024);
}

TEST_F(CudaKernelTest, PointwiseBFloat16AndFloat16StoreBitsAndComputeInFloat) {
  for (kiln::v1::DType dtype : {kBF16, kF16}) {
    auto body = Build(CudaRequest(PointwiseChain(dtype)), nullptr);
    KILN_SKIP_IF_NO_NVRTC();
    const std::string& src = body.kernel_source();
    EXPECT_NE(src.find("kiln_vec<uint16_t, 8>"), std::string::npos) << dtype;
    EXPECT_NE(src.find(dtype == kBF16 ? "kiln_bf16_store" : "kiln_f16_store"), std::string::npos);
    EXPECT_EQ(src.find("#include"), std::string::npos) << "NVRTC is given no headers";
    ASSERT_EQ(Launches(body.plan()).size(), 1u);
    EXPECT_GE(Threads(*Launches(body.plan())[0]) * 8, 64 * 1024);
  }
}

// A bias over the rows of [rows, C] (a channels-last convolution's result, C its channels) and a
// column: rows of whole vectors take the vector path, the bias moved as vectors along the row and
// the column read once per vector.
TEST_F(CudaKernelTest, BiasOverRowsOfWholeVectorsTakesTheVectorPath) {
  GraphBuilder b;
  uint32_t x = b.Input({32, 96}), bias = b.Input({96}), col = b.Input({32, 1});
  uint32_t s = b.Op("aten::add.Tensor", {V(x), V(bias)}, {32, 96});
  uint32_t m = b.Op("aten::mul.Tensor", {V(s), V(col)}, {32, 96});
  b.Output(b.Op("aten::relu", {V(m)}, {32, 96}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u);
  const std::string& src = body.kernel_source();
  EXPECT_NE(src.find("kiln_aligned"), std::string::npos) << src;
  // The vector's first element: row k0, column k1 (a multiple of 4).
  EXPECT_NE(src.find("const int k0 = (q * 4) / 96;"), std::string::npos) << src;
  EXPECT_NE(src.find("const int k1 = (q * 4) % 96;"), std::string::npos) << src;
  EXPECT_NE(src.find("reinterpret_cast<const kiln_vec<float, 4>*>(in1 + 0 + k1)"),
            std::string::npos) << src;
  EXPECT_NE(src.find("in2[0 + k0]"), std::string::npos) << src;
  EXPECT_GE(Threads(*Launches(body.plan())[0]) * 4, 32 * 96);
}

TEST_F(CudaKernelTest, BroadcastOverRowsOfPartVectorsTakesTheScalarPath) {
  GraphBuilder b;
  uint32_t x = b.Input({32, 102}), bias = b.Input({102});
  uint32_t s = b.Op("aten::add.Tensor", {V(x), V(bias)}, {32, 102});
  b.Output(b.Op("aten::relu", {V(s)}, {32, 102}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u);
  EXPECT_EQ(body.kernel_source().find("kiln_aligned"), std::string::npos);
  EXPECT_GE(Threads(*Launches(body.plan())[0]), 32 * 102);
}

TEST_F(CudaKernelTest, NonContiguousOperandAndSizeOneDimsIndexWithTheirStrides) {
  GraphBuilder b;
  // x is the transpose of a [16, 8, 1] buffer; y has size-1 dims that broadcast.
  uint32_t x = b.Input({8, 1, 16}, kF32, {1, 1, 8});
  uint32_t y = b.Input({1, 1, 16});
  uint32_t s = b.Op("aten::sub.Tensor", {V(x), V(y)}, {8, 1, 16});
  b.Output(b.Op("aten::exp", {V(s)}, {8, 1, 16}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u);
  EXPECT_NE(body.kernel_source().find(" * 8"), std::string::npos) << body.kernel_source();
  EXPECT_EQ(body.kernel_source().find("kiln_aligned"), std::string::npos);
  EXPECT_GE(Threads(*Launches(body.plan())[0]), 8 * 16);
}

TEST_F(CudaKernelTest, ViewAtAnUnalignedOffsetKeepsTheScalarPathOnly) {
  GraphBuilder b;
  uint32_t x = b.Input({1024});
  // x[1:]: the kernel reads x one element past its (maybe aligned) pointer.
  uint32_t tail =
      b.Op("aten::slice.Tensor", {V(x), I(0), I(1), I(1024), I(1)}, {1023}, kF32, {1}, 1);
  b.Output(b.Op("aten::neg", {V(tail)}, {1023}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  EXPECT_EQ(body.kernel_source().find("kiln_aligned"), std::string::npos);
}

TEST_F(CudaKernelTest, EmptyAndZeroDimSpacesLaunchOneBlockThatDoesNothing) {
  GraphBuilder b;
  uint32_t x = b.Input({0, 16}), s = b.Input({});
  b.Output(b.Op("aten::relu", {V(x)}, {0, 16}));
  b.Output(b.Op("aten::sigmoid", {V(s)}, {}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  for (const auto* k : Launches(body.plan())) EXPECT_EQ(k->grid(0), 1u);
}

TEST_F(CudaKernelTest, Int64AndBoolKernels) {
  GraphBuilder b;
  uint32_t x = b.Input({256}, kI64), y = b.Input({256}, kI64);
  uint32_t s = b.Op("aten::add.Tensor", {V(x), V(y)}, {256}, kI64);
  uint32_t gt = b.Op("aten::gt.Scalar", {V(s), I(3)}, {256}, kBool);
  b.Output(s);
  b.Output(b.Op("aten::logical_not", {V(gt)}, {256}, kBool));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  EXPECT_EQ(Launches(body.plan()).size(), 1u);
  EXPECT_NE(body.kernel_source().find("kiln_vec<int64_t, 2>"), std::string::npos);
}

// softmax(x) over the last dim, as lowering decomposes it.
GraphBuilder Softmax(std::vector<int64_t> sizes, kiln::v1::DType dtype) {
  GraphBuilder b;
  std::vector<int64_t> row = sizes;
  row.back() = 1;
  uint32_t x = b.Input(sizes, dtype);
  uint32_t m = b.Op("aten::amax", {V(x), Ints({-1}), B(true)}, row, dtype);
  uint32_t d = b.Op("aten::sub.Tensor", {V(x), V(m)}, sizes, dtype);
  uint32_t e = b.Op("aten::exp", {V(d)}, sizes, dtype);
  uint32_t s = b.Op("aten::sum.dim_IntList", {V(e), Ints({-1}), B(true)}, row, dtype);
  b.Output(b.Op("aten::div.Tensor", {V(e), V(s)}, sizes, dtype));
  return b;
}

TEST_F(CudaKernelTest, SoftmaxIsOneRowKernelWithABlockPerRow) {
  for (kiln::v1::DType dtype : {kF32, kBF16, kF16}) {
    auto body = Build(CudaRequest(Softmax({64, 1000}, dtype)), nullptr);
    KILN_SKIP_IF_NO_NVRTC();
    ASSERT_EQ(Launches(body.plan()).size(), 1u) << dtype;
    const auto& k = *Launches(body.plan())[0];
    EXPECT_EQ(k.grid(0), 64u);
    EXPECT_EQ(k.block(0), 256u);  // about 4 elements of a row per thread
    EXPECT_NE(body.kernel_source().find("kiln_block_reduce<kiln_max<float>>"), std::string::npos);
    EXPECT_NE(body.kernel_source().find("kiln_block_reduce<kiln_sum<float>>"), std::string::npos);
  }
}

TEST_F(CudaKernelTest, LayerNormAndVarMeanAreRowKernels) {
  GraphBuilder b;
  const std::vector<int64_t> sizes{128, 768}, row{128, 1};
  uint32_t x = b.Input(sizes, kBF16), w = b.Input({768}, kBF16), bias = b.Input({768}, kBF16);
  uint32_t mean = b.Op("aten::mean.dim", {V(x), Ints({-1}), B(true)}, row, kBF16);
  uint32_t var =
      b.Op("aten::var.correction",
           {V(x), Ints({-1}), Named("correction", I(0)), Named("keepdim", B(true))}, row, kBF16);
  uint32_t eps = b.Op("aten::add.Scalar", {V(var), F(1e-5)}, row, kBF16);
  uint32_t inv = b.Op("aten::rsqrt", {V(eps)}, row, kBF16);
  uint32_t c = b.Op("aten::sub.Tensor", {V(x), V(mean)}, sizes, kBF16);
  uint32_t n = b.Op("aten::mul.Tensor", {V(c), V(inv)}, sizes, kBF16);
  uint32_t s = b.Op("aten::mul.Tensor", {V(n), V(w)}, sizes, kBF16);
  b.Output(b.Op("aten::add.Tensor", {V(s), V(bias)}, sizes, kBF16));
  b.Output(mean);
  b.Output(inv);
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u) << body.kernel_source();
  EXPECT_EQ(Launches(body.plan())[0]->grid(0), 128u);

  GraphBuilder vm;
  uint32_t y = vm.Input({32, 4, 256});
  uint32_t v =
      vm.Op("aten::var_mean.correction", {V(y), Ints({1, 2}), Named("correction", I(1))}, {32});
  // var_mean has two outputs: add the mean to the node the builder made.
  kiln::v1::CompileRequest request = CudaRequest(vm);
  kiln::v1::Node* n2 = request.mutable_graph()->mutable_nodes(0);
  kiln::v1::Value* mean_out = n2->add_outputs();
  *mean_out = n2->outputs(0);
  mean_out->set_id(v + 1);
  request.mutable_graph()->add_outputs(v);
  request.mutable_graph()->add_outputs(v + 1);
  auto vm_body = Build(request, nullptr);
  ASSERT_EQ(Launches(vm_body.plan()).size(), 1u) << vm_body.kernel_source();
  EXPECT_EQ(Launches(vm_body.plan())[0]->grid(0), 32u);
  EXPECT_EQ(Launches(vm_body.plan())[0]->block(0), 256u);
}

TEST_F(CudaKernelTest, RowsOfAFewElementsPerThreadStayInRegistersAcrossPasses) {
  // layer_norm(gelu(x + bias)) over rows of 1024 (the anchors' MLP block): 256 threads, 4
  // elements each. The prologue (bias add, erf) is computed once, in the pass of the mean; the
  // variance's pass and the normalizing store read it from registers.
  GraphBuilder b;
  const std::vector<int64_t> sizes{64, 1024}, row{64, 1};
  uint32_t x = b.Input(sizes), bias = b.Input({1024});
  uint32_t a = b.Op("aten::add.Tensor", {V(x), V(bias)}, sizes);
  uint32_t g = b.Op("aten::gelu", {V(a)}, sizes);
  uint32_t mean = b.Op("aten::mean.dim", {V(g), Ints({-1}), B(true)}, row);
  uint32_t var = b.Op("aten::var.correction",
                      {V(g), Ints({-1}), Named("correction", I(0)), Named("keepdim", B(true))},
                      row);
  uint32_t inv = b.Op("aten::rsqrt", {V(b.Op("aten::add.Scalar", {V(var), F(1e-5)}, row))}, row);
  uint32_t c = b.Op("aten::sub.Tensor", {V(g), V(mean)}, sizes);
  b.Output(b.Op("aten::mul.Tensor", {V(c), V(inv)}, sizes));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u) << body.kernel_source();
  EXPECT_EQ(Launches(body.plan())[0]->block(0), 256u);
  const std::string& src = body.kernel_source();
  const std::string kernel = src.substr(src.find("kiln_kernel_0("));
  EXPECT_NE(kernel.find("for (int kiln_u = 0; kiln_u < 4; ++kiln_u)"), std::string::npos) << src;
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = kernel.find(what); at != std::string::npos; at = kernel.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("erf"), 1) << kernel;    // gelu once, not once per pass
  EXPECT_EQ(count("in0["), 1) << kernel;   // x loaded once
  EXPECT_GE(count("[kiln_u]"), 3) << kernel;

  // Rows of 5000 (block 1024, 5 each) still unroll; 9000 (9 each) loop with a block stride.
  for (int64_t length : {5000, 9000}) {
    auto soft = Build(CudaRequest(Softmax({64, length}, kF32)), nullptr);
    EXPECT_EQ(soft.kernel_source().find("kiln_u") != std::string::npos, length == 5000)
        << soft.kernel_source();
  }
}

TEST_F(CudaKernelTest, LongRowsLoopWithTheLargestBlock) {
  GraphBuilder b;
  uint32_t x = b.Input({64, 100000});
  uint32_t sq = b.Op("aten::mul.Tensor", {V(x), V(x)}, {64, 100000});
  b.Output(b.Op("aten::sum.dim_IntList", {V(sq), Ints({1})}, {64}));
  auto body = Build(CudaRequest(b), nullptr);
  KILN_SKIP_IF_NO_NVRTC();
  ASSERT_EQ(Launches(body.plan()).size(), 1u);
  EXPECT_EQ(Launches(body.plan())[0]->block(0), 1024u);
  EXPECT_EQ(Launches(body.plan())[0]->grid(0), 64u);
}

TEST_F(CudaKernelTest, ChannelsLastSpatialMeanTakesColumnBlocksOverAdjacentRows) {
  // hardswish(x).mean((2, 3)) * x on a channels-last [8, 48, 7, 7]: the rows (n, c) are adjacent
  // in memory, the 49 elements of a row 48 apart. A (32, Y) block covers 32 rows, so a warp's
  // loads are contiguous; 384 rows are 12 tiles.
  const std::vector<int64_t> sizes{8, 48, 7, 7}, nhwc{2352, 1, 336, 48}, row{8, 48, 1, 1};
  for (bool channels_last : {true, false}) {
    GraphBuilder b;
    uint32_t x = channels_last ? b.Input(sizes, kF32, nhwc) : b.Input(sizes, kF32);
    const std::vector<int64_t> strides = channels_last ? nhwc : std::vector<int64_t>{};
    uint32_t h = b.Op("aten::hardswish", {V(x)}, sizes, kF32, strides);
    uint32_t m = b.Op("aten::mean.dim", {V(h), Ints({2, 3}), B(true)}, row);
    b.Output(b.Op("aten::mul.Tensor", {V(m), V(x)}, sizes, kF32, strides));
    auto body = Build(CudaRequest(b), nullptr);
    KILN_SKIP_IF_NO_NVRTC();
    const auto launches = Launches(body.plan());
    ASSERT_GE(launches.size(), 1u) << body.kernel_source();
    const kiln::v1::KernelLaunch& k = *launches[0];
    if (channels_last) {
      EXPECT_EQ(k.block(0), 32u);
      EXPECT_EQ(k.block(1), 8u);  // 49 elements: about 8 each
      EXPECT_EQ(k.grid(0), 12u);
      EXPECT_NE(body.kernel_source().find("kiln_column_reduce<"), std::string::npos);
    } else {
      EXPECT_EQ(k.block(1), 1u);
      EXPECT_EQ(k.grid(0), 384u);
      EXPECT_EQ(body.kernel_source().find("kiln_column_reduce<"), std::string::npos);
    }
  }
}

// A depthwise convolution (groups == channels, [C, 1, KH, KW] weight), its bias moved into an
// epilogue add, then hardswish: a bound weight and bias, an input of `strides` (channels-last or
// row-major).
GraphBuilder DepthwiseConvolution(kiln::v1::DType dtype, std::vector<int64_t> x_strides,
                                  std::vector<int64_t> y_strides, int64_t groups = 16,
                                  int64_t weight_channels = 1) {
  GraphBuilder b;
  uint32_t w = b.Input({16, weight_channels, 3, 5}, dtype);
  uint32_t bias = b.Input({16}, dtype);
  b.Bound(2);
  uint32_t x = b.Input({2, 16, 9, 11}, dtype, x_strides);
  // stride (2, 1), padding (1, 2), dilation (1, 1): [2, 16, 5, 11]
  uint32_t conv = b.Op("aten::convolution",
                       {V(x), V(w), V(bias), Ints({2, 1}), Ints({1, 2}), Ints({1, 1}), B(false),
                        Ints({0, 0}), I(groups)},
                       {2, 16, 5, 11}, dtype, y_strides);
  b.Output(b.Op("aten::hardswish", {V(conv)}, {2, 16, 5, 11}, dtype, y_strides));
  return b;
}

TEST_F(CudaKernelTest, DepthwiseConvolutionIsOneKernelWithItsEpilogue) {
  // A window loop of 3 x 5 taps skipping the padding, in the output's memory order. Channels-last:
  // the channels are the innermost dim and each thread takes 16 bytes of them (4 float32, 8
  // 16-bit), one vector load of the input per tap; row-major: one element per thread. The
  // convolution's input and weight are read by the window, the bias by the epilogue: three
  // pointers and the output.
  const std::vector<int64_t> nhwc_x{1584, 1, 176, 16}, nhwc_y{880, 1, 176, 16};
  for (kiln::v1::DType dtype : {kF32, kBF16, kF16}) {
    for (bool channels_last : {true, false}) {
      auto body = Build(CudaRequest(DepthwiseConvolution(
                            dtype, channels_last ? nhwc_x : std::vector<int64_t>{},
                            channels_last ? nhwc_y : std::vector<int64_t>{})),
                        nullptr);
      KILN_SKIP_IF_NO_NVRTC();
      const kiln::v1::ExecutionPlan& plan = body.plan();
      ASSERT_EQ(plan.steps_size(), 1) << plan.DebugString() << body.kernel_source();
      ASSERT_TRUE(plan.steps(0).has_kernel());
      const kiln::v1::KernelLaunch& k = plan.steps(0).kernel();
      EXPECT_EQ(k.args_size(), 4);
      const int64_t width = channels_last ? (dtype == kF32 ? 4 : 8) : 1;
      EXPECT_GE(Threads(k), 2 * 16 * 5 * 11 / width);
      const std::string& src = body.kernel_source();
      EXPECT_NE(src.find("for (int kh = 0; kh < 3; ++kh)"), std::string::npos) << src;
      EXPECT_NE(src.find("for (int kw = 0; kw < 5; ++kw)"), std::string::npos) << src;
      EXPECT_NE(src.find("ih = i" + std::string(channels_last ? "1" : "2") + " * 2 - 1"),
                std::string::npos)
          << src;
      EXPECT_NE(src.find("if (iw < 0 || iw >= 11) continue;"), std::string::npos) << src;
      const std::string vector_load = "const kiln_vec<" +
                                      std::string(dtype == kF32 ? "float" : "uint16_t") + ", " +
                                      std::to_string(width) + "> xv = ";
      EXPECT_EQ(src.find(vector_load) != std::string::npos, channels_last) << src;
      // The bound weight is copied once, channels innermost, by the prologue (ATen's clone of
      // the permuted weight, no kernel of its own): a tap's weights are one vector on the
      // vector path, at the channel's index (stride 1) on the scalar one.
      std::vector<std::string> prologue_ops;
      for (const kiln::v1::PlanStep& step : plan.prologue()) {
        ASSERT_TRUE(step.has_library()) << plan.DebugString();
        prologue_ops.push_back(step.library().op());
      }
      EXPECT_EQ(prologue_ops, (std::vector<std::string>{"aten::permute", "aten::clone"}));
      EXPECT_EQ(src.find("const kiln_vec<" + std::string(dtype == kF32 ? "float" : "uint16_t") +
                         ", " + std::to_string(width) + "> wv = ") != std::string::npos,
                channels_last)
          << src;
      EXPECT_NE(src.find("in1[0 + i" + std::string(channels_last ? "3" : "1") +
                         " * 1 + kh * 80 + kw * 16]"),
                std::string::npos)
          << src;
      EXPECT_EQ(src.find("kiln_aligned") != std::string::npos, channels_last) << src;
    }
  }
}

// Each layer's kernels are the same code: NVRTC builds one function per distinct kernel, and
// every step of a repeated one launches the first. The cubin check (Build) finds each launched
// symbol in the cubin.
// x [s0, s1, 64] per call (dtype): a = x + x, the row max of a, a - max: a pointwise kernel and a
// row kernel over s0 * s1 rows that NVRTC builds once for every size.
TEST_F(CudaKernelTest, KernelsOverSymbolicRowsTakeTheirExtentAndGridPerCall) {
  for (kiln::v1::DType dtype : {kF32, kBF16}) {
    GraphBuilder b;
    const uint32_t x = b.Input({3, 5, 64}, dtype);
    const uint32_t a = b.Op("aten::add.Tensor", {V(x), V(x)}, {3, 5, 64}, dtype);
    const uint32_t m = b.Op("aten::amax", {V(a), Ints({-1}), B(true)}, {3, 5, 1}, dtype);
    const uint32_t d = b.Op("aten::sub.Tensor", {V(a), V(m)}, {3, 5, 64}, dtype);
    const uint32_t t = b.Op("aten::mul.Scalar", {V(x), F(3.0)}, {3, 5, 64}, dtype);
    b.Output(d);
    b.Output(t);
    kiln::v1::CompileRequest request = CudaRequest(b);
    kiln::v1::Graph* g = request.mutable_graph();
    const std::vector<kiln::v1::SymExpr> full{Term(1, {0}), Term(1, {1}), Term(64)};
    SetSymbolic(g->mutable_inputs(0)->mutable_meta(), full);
    for (int n : {0, 2, 3}) SetSymbolic(g->mutable_nodes(n)->mutable_outputs(0)->mutable_meta(), full);
    SetSymbolic(g->mutable_nodes(1)->mutable_outputs(0)->mutable_meta(),
                {Term(1, {0}), Term(1, {1}), Term(1)});
    AddSizeSymbols(g, x, 2, 2);
    auto body = Build(request, nullptr);
    KILN_SKIP_IF_NO_NVRTC();
    const auto launches = Launches(body.plan());
    ASSERT_FALSE(launches.empty());
    for (const kiln::v1::KernelLaunch* k : launches) {
      ASSERT_EQ(k->size_args_size(), 1) << k->symbol();
      EXPECT_EQ(k->size_args(0).SerializeAsString(), Term(1, {0, 1}).SerializeAsString());
      ASSERT_TRUE(k->has_grid_work()) << k->symbol();
      EXPECT_GT(k->grid_work_per_block(), 0u);
      EXPECT_GT(k->grid_max(), 0u);
      // The work is a multiple of the rows (s0 * s1): rows for a row kernel, elements otherwise.
      ASSERT_EQ(k->grid_work().terms_size(), 1);
      EXPECT_EQ(k->grid_work().terms(0).symbols_size(), 2);
    }
    EXPECT_NE(body.kernel_source().find("const int64_t kiln_outer"), std::string::npos);
    EXPECT_NE(body.kernel_source().find("kiln_row < kiln_outer;"), std::string::npos);
  }
}

TEST_F(CudaKernelTest, RepeatedLayersBuildEachDistinctKernelOnce) {
  for (kiln::v1::DType dtype : {kF32, kBF16}) {
    auto body = Build(CudaRequest(kiln::testing::RepeatedLayers(4, dtype)), nullptr);
    KILN_SKIP_IF_NO_NVRTC();
    const auto launches = Launches(body.plan());
    ASSERT_EQ(launches.size(), 9u) << body.kernel_source();
    std::vector<std::string> symbols;
    for (const kiln::v1::KernelLaunch* k : launches) symbols.push_back(k->symbol());
    for (int layer = 1; layer < 4; ++layer) {
      EXPECT_EQ(symbols[2 * layer], symbols[0]) << "layer " << layer << "'s pointwise kernel";
      EXPECT_EQ(symbols[2 * layer + 1], symbols[1]) << "layer " << layer << "'s row kernel";
      EXPECT_EQ(launches[2 * layer + 1]->grid(0), launches[1]->grid(0));
    }
    EXPECT_NE(symbols[8], symbols[0]) << "the [64, 128] kernel is other code";
    EXPECT_NE(symbols[1], symbols[0]);
    size_t functions = 0;
    for (size_t at = body.kernel_source().find("__global__"); at != std::string::npos;
         at = body.kernel_source().find("__global__", at + 1)) {
      ++functions;
    }
    EXPECT_EQ(functions, 3u) << body.kernel_source();
  }
}

TEST(CudaCompilerTest, ConvolutionsThatMixChannelsStayWithCudnn) {
  // groups == 1 (a full convolution) and a channel multiplier (16 groups of 32 outputs over 16
  // inputs would need [16, 1] filters per output: here 8 groups of 2 input channels) are
  // library calls; so is every convolution on a CPU target.
  GraphBuilder full;
  uint32_t w = full.Input({16, 16, 3, 3});
  uint32_t x = full.Input({2, 16, 8, 8});
  full.Output(full.Op("aten::convolution",
                      {V(x), V(w), None(), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false),
                       Ints({0, 0}), I(1)},
                      {2, 16, 8, 8}));
  const GraphBuilder grouped =
      DepthwiseConvolution(kF32, {}, {}, /*groups=*/8, /*weight_channels=*/2);
  const GraphBuilder* cases[] = {&full, &grouped};
  for (const GraphBuilder* b : cases) {
    auto generated = GenerateCuda(CudaRequest(*b));
    ASSERT_TRUE(generated.ok()) << generated.status();
    const kiln::v1::ExecutionPlan& plan = generated->body.plan();
    ASSERT_GE(plan.steps_size(), 1);
    ASSERT_TRUE(plan.steps(0).has_library()) << plan.DebugString();
    EXPECT_EQ(plan.steps(0).library().op(), "aten::convolution");
  }
  GraphBuilder dw = DepthwiseConvolution(kF32, {}, {});
  FusedProgram cpu = FuseGraph(dw.Request().graph(), nullptr, kiln::v1::DEVICE_KIND_CPU);
  for (const FusedGroup& g : cpu.groups) EXPECT_LT(g.convolution, 0);
}

TEST(CudaCompilerTest, ADepthwiseConvolutionGroupNeverTakesAReductionOrAnotherKernel) {
  // relu(conv(x)) beside relu(x2) over the same space, then a mean over H and W of the first:
  // the convolution's group keeps its epilogue only; the mean is a row-wise kernel of its own.
  GraphBuilder b;
  uint32_t w = b.Input({16, 1, 3, 3});
  b.Bound(1);
  uint32_t x = b.Input({2, 16, 8, 8});
  uint32_t x2 = b.Input({2, 16, 8, 8});
  uint32_t other = b.Op("aten::relu", {V(x2)}, {2, 16, 8, 8});
  uint32_t conv = b.Op("aten::convolution",
                       {V(x), V(w), None(), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false),
                        Ints({0, 0}), I(16)},
                       {2, 16, 8, 8});
  uint32_t r = b.Op("aten::relu", {V(conv)}, {2, 16, 8, 8});
  uint32_t m = b.Op("aten::mean.dim", {V(r), Ints({2, 3}), B(true)}, {2, 16, 1, 1});
  b.Output(other);
  b.Output(m);
  kiln::v1::CompileRequest request = CudaRequest(b);
  FusedProgram program = FuseGraph(request.graph(), nullptr, kiln::v1::DEVICE_KIND_CUDA);
  int conv_groups = 0;
  for (const FusedGroup& g : program.groups) {
    if (g.convolution < 0) continue;
    ++conv_groups;
    EXPECT_EQ(g.outer_rank, -1);
    EXPECT_EQ(g.nodes.size(), 2u);  // the convolution and its relu
  }
  EXPECT_EQ(conv_groups, 1);
  EXPECT_EQ(program.groups.size(), 3u);
}

TEST(CudaCompilerTest, WithoutNvrtcCudaTargetsAreUnimplementedWithTheReason) {
  absl::StatusOr<std::unique_ptr<Nvrtc>> none = Nvrtc::Load({"/nonexistent/libnvrtc.so.13"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(none.status().message().find("no NVRTC"), std::string::npos);
  CudaCompiler compiler{std::move(none)};
  EXPECT_EQ(compiler.Version(), "kiln-cuda-11|no-nvrtc");
  auto body = compiler.Compile(CudaRequest(PointwiseChain(kF32)));
  ASSERT_FALSE(body.ok());
  const kiln::v1::CompileError e = CompileErrorFromStatus(body.status());
  EXPECT_EQ(e.code(), kiln::v1::CompileError::CODE_UNIMPLEMENTED);
  EXPECT_NE(e.message().find("no NVRTC"), std::string::npos);
}

TEST(CudaCompilerTest, GenerateCudaFillsLaunchesWithoutBuilding) {
  auto generated = GenerateCuda(CudaRequest(Softmax({8, 32}, kF32)));
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_FALSE(generated->source.empty());
  for (const auto* k : Launches(generated->body.plan())) {
    EXPECT_NE(generated->source.find("void __launch_bounds__(" + std::to_string(k->block(0)) +
                                     ") " + k->symbol() + "("),
              std::string::npos);
  }
}

TEST(CudaCompilerTest, ConvolutionBiasIsAddedByTheKernelThatReadsTheResult) {
  // ATen's CUDA convolution adds a bias in a pass of its own; the plan calls it without one
  // and the ReLU's kernel adds it. A bias of another dtype than the result stays with ATen.
  for (kiln::v1::DType bias_dtype : {kF32, kBF16}) {
    GraphBuilder b;
    uint32_t w = b.Input({8, 3, 3, 3});
    uint32_t bias = b.Input({8}, bias_dtype);
    b.Bound(2);
    uint32_t x = b.Input({2, 3, 8, 8});
    uint32_t conv = b.Op("aten::convolution",
                         {V(x), V(w), V(bias), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false),
                          Ints({0, 0}), I(1)},
                         {2, 8, 8, 8});
    b.Output(b.Op("aten::relu", {V(conv)}, {2, 8, 8, 8}));
    auto generated = GenerateCuda(CudaRequest(b));
    ASSERT_TRUE(generated.ok()) << generated.status();
    const kiln::v1::ExecutionPlan& plan = generated->body.plan();
    ASSERT_EQ(plan.steps_size(), 2) << plan.DebugString();
    ASSERT_TRUE(plan.steps(0).has_library());
    const kiln::v1::LibraryCall& call = plan.steps(0).library();
    EXPECT_EQ(call.op(), "aten::convolution");
    const bool moved = bias_dtype == kF32;
    EXPECT_EQ(call.args(2).kind_case() == kiln::v1::Argument::kNone, moved);
    ASSERT_TRUE(plan.steps(1).has_kernel());
    // The kernel reads the convolution's result, and the bias where it was moved.
    EXPECT_EQ(plan.steps(1).kernel().args_size(), moved ? 3 : 2);
  }
}

// The library calls of a plan's steps (not its prologue) other than views, in order.
std::vector<std::string> LibraryOps(const kiln::v1::ExecutionPlan& plan) {
  std::vector<std::string> ops;
  for (const auto& s : plan.steps()) {
    if (s.has_library() && s.library().op() != "aten::view") ops.push_back(s.library().op());
  }
  return ops;
}

// A linear layer as lowering decomposes it: mm(x, w^T) + bias, optionally through the reshape
// of a 3-D input, the sum a graph output or read by a GELU (`activation`); `bias_dtype` and
// `bias_sizes` vary the bias, and `product_read` makes the product a graph output too.
GraphBuilder Linear(kiln::v1::DType dtype, bool three_d, kiln::v1::DType bias_dtype,
                    std::vector<int64_t> bias_sizes, bool product_read, bool activation) {
  GraphBuilder b;
  uint32_t w = b.Input({16, 32}, dtype);
  uint32_t bias = b.Input(bias_sizes, bias_dtype);
  b.Bound(2);
  uint32_t x = b.Input(three_d ? std::vector<int64_t>{2, 4, 32} : std::vector<int64_t>{8, 32},
                       dtype);
  if (three_d) x = b.Op("aten::view", {V(x), Ints({8, 32})}, {8, 32}, dtype);
  uint32_t t = b.Op("aten::t", {V(w)}, {32, 16}, dtype, {1, 32});
  uint32_t product = b.Op("aten::mm", {V(x), V(t)}, {8, 16}, dtype);
  uint32_t value = product;
  std::vector<int64_t> sizes{8, 16};
  if (three_d) {
    sizes = {2, 4, 16};
    value = b.Op("aten::view", {V(product), Ints(sizes)}, sizes, dtype);
  }
  uint32_t sum = b.Op("aten::add.Tensor", {V(value), V(bias)}, sizes, dtype);
  b.Output(activation ? b.Op("aten::gelu", {V(sum)}, sizes, dtype) : sum);
  if (product_read) b.Output(product);
  return b;
}

TEST(CudaCompilerTest, ALinearThatEndsTheGraphAddsItsBiasInTheGemmAsEagerDoes) {
  // aten::addmm, as eager's linear runs: ATen hands the bias to cuBLASLt's epilogue, and no
  // kernel is left to add it; through a 3-D input's reshape too.
  for (kiln::v1::DType dtype : {kF32, kBF16, kF16}) {
    for (bool three_d : {false, true}) {
      GraphBuilder b = Linear(dtype, three_d, dtype, {16}, false, false);
      auto generated = GenerateCuda(CudaRequest(b));
      ASSERT_TRUE(generated.ok()) << generated.status();
      const kiln::v1::ExecutionPlan& plan = generated->body.plan();
      EXPECT_EQ(LibraryOps(plan), std::vector<std::string>{"aten::addmm"}) << plan.DebugString();
      EXPECT_EQ(Launches(plan).size(), 0u);
      const kiln::v1::LibraryCall* call = nullptr;
      for (const auto& s : plan.steps()) {
        if (s.has_library() && s.library().op() == "aten::addmm") call = &s.library();
      }
      ASSERT_NE(call, nullptr);
      ASSERT_EQ(call->args_size(), 3);
      EXPECT_EQ(call->args(0).kind_case(), kiln::v1::Argument::kValue);
      EXPECT_EQ(call->args(0).value(), 1u);  // the bias (the builder's second input) first
    }
  }
}

TEST(CudaCompilerTest, ABiasAddAKernelReadsOrTheGemmCannotTakeStaysMmAndAnAdd) {
  struct Case {
    kiln::v1::DType bias_dtype;
    std::vector<int64_t> bias_sizes;
    bool product_read, activation;
  };
  // The sum read by a GELU (the add fuses into its kernel), a bias of another dtype (the sum
  // promotes), a bias over the whole product, the product read twice.
  for (const Case& c : {Case{kBF16, {16}, false, true}, Case{kF32, {16}, false, false},
                        Case{kBF16, {8, 16}, false, false}, Case{kBF16, {16}, true, false}}) {
    GraphBuilder b = Linear(kBF16, false, c.bias_dtype, c.bias_sizes, c.product_read,
                            c.activation);
    PassStats stats;
    kiln::v1::Graph g = LinearBiasAsGemmEpilogue(CudaRequest(b).graph(), &stats);
    EXPECT_EQ(stats.gemm_bias_epilogues, 0);
    int mms = 0, addmms = 0;
    for (const auto& n : g.nodes()) {
      mms += n.op() == "aten::mm";
      addmms += n.op() == "aten::addmm";
    }
    EXPECT_EQ(mms, 1);
    EXPECT_EQ(addmms, 0);
  }
  PassStats stats;
  LinearBiasAsGemmEpilogue(CudaRequest(Linear(kBF16, true, kBF16, {16}, false, false)).graph(),
                           &stats);
  EXPECT_EQ(stats.gemm_bias_epilogues, 1);
}

TEST(CudaCompilerTest, TargetsOtherThanSmXYAreUnimplemented) {
  for (const char* arch : {"sm_9", "compute_90", "sm_90x", ""}) {
    auto generated = GenerateCuda(CudaRequest(PointwiseChain(kF32), arch));
    ASSERT_FALSE(generated.ok()) << arch;
    EXPECT_EQ(CompileErrorFromStatus(generated.status()).code(),
              kiln::v1::CompileError::CODE_UNIMPLEMENTED);
  }
  EXPECT_TRUE(GenerateCuda(CudaRequest(PointwiseChain(kF32), "sm_90a")).ok());
  EXPECT_FALSE(GenerateCuda(PointwiseChain(kF32).Request()).ok());  // a CPU target
}

TEST(CudaCompilerTest, FusionKeepsEachDeviceToItsOwnCompiler) {
  // A CUDA graph compiled for a CPU target fuses nothing, and the other way round.
  kiln::v1::CompileRequest cuda = CudaRequest(PointwiseChain(kF32));
  EXPECT_EQ(FuseGraph(cuda.graph()).groups.size(), 0u);
  EXPECT_EQ(FuseGraph(cuda.graph(), nullptr, kiln::v1::DEVICE_KIND_CUDA).groups.size(), 1u);
  EXPECT_EQ(
      FuseGraph(PointwiseChain(kF32).graph(), nullptr, kiln::v1::DEVICE_KIND_CUDA).groups.size(),
      0u);
}

TEST(TargetCompilerTest, DispatchesOnTheDeviceKindAndVersionsBoth) {
  TargetCompiler compiler(std::make_unique<CpuCompiler>(),
                          std::make_unique<CudaCompiler>(Nvrtc::Load({"/nonexistent/libnvrtc"})));
  EXPECT_NE(compiler.Version().find("kiln-cpu-"), std::string::npos);
  EXPECT_NE(compiler.Version().find("||kiln-cuda-11|no-nvrtc"), std::string::npos);
  auto cpu = compiler.Compile(PointwiseChain(kF32).Request());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->format(), kiln::v1::BINARY_FORMAT_ELF_SHARED_OBJECT);
  auto cuda = compiler.Compile(CudaRequest(PointwiseChain(kF32)));
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(CompileErrorFromStatus(cuda.status()).code(),
            kiln::v1::CompileError::CODE_UNIMPLEMENTED);
}

TEST(TargetCompilerTest, EachKindsKeysDependOnlyOnItsOwnCompiler) {
  const auto with_nvrtc_missing = [](const std::string& path) {
    return TargetCompiler(std::make_unique<CpuCompiler>(),
                          std::make_unique<CudaCompiler>(Nvrtc::Load({path})));
  };
  TargetCompiler a = with_nvrtc_missing("/nonexistent/a/libnvrtc");
  CpuCompiler cpu;
  EXPECT_EQ(a.VersionFor(kiln::v1::DEVICE_KIND_CPU), cpu.Version());
  EXPECT_EQ(a.VersionFor(kiln::v1::DEVICE_KIND_CUDA), "kiln-cuda-11|no-nvrtc");
  // Whether a daemon has NVRTC changes neither its CPU keys nor what its CPU artifacts carry.
  std::string why;
  std::unique_ptr<Nvrtc> nvrtc = kiln::testing::LoadNvrtcForTests(&why);
  if (nvrtc == nullptr) {
    if (!kiln::testing::NvrtcRequired()) GTEST_SKIP() << why;
    FAIL() << why << " (set KILN_NVRTC, or KILN_NVRTC_REQUIRED=0 to skip)";
  }
  TargetCompiler b(std::make_unique<CpuCompiler>(), std::make_unique<CudaCompiler>(std::move(nvrtc)));
  EXPECT_EQ(a.VersionFor(kiln::v1::DEVICE_KIND_CPU), b.VersionFor(kiln::v1::DEVICE_KIND_CPU));
  EXPECT_NE(a.VersionFor(kiln::v1::DEVICE_KIND_CUDA), b.VersionFor(kiln::v1::DEVICE_KIND_CUDA));
}

TEST_F(CudaKernelTest, CompileErrorsFromNvrtcAreToolchainErrorsWithItsLog) {
  std::string why;
  auto nvrtc = kiln::testing::LoadNvrtcForTests(&why);
  if (nvrtc == nullptr) {
    if (!kiln::testing::NvrtcRequired()) GTEST_SKIP() << "SKIPPED: " << why;
    FAIL() << why;
  }
  EXPECT_NE(nvrtc->Version().rfind("nvrtc-", 0), std::string::npos);
  auto built = nvrtc->Build("extern \"C\" __global__ void k() { undefined_name(); }", "sm_90");
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("undefined_name"), std::string::npos)
      << built.status().message();
}

}  // namespace
}  // namespace kiln::compiler
