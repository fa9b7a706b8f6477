// IR validation: the sample graph passes; each kind of malformed request is InvalidArgument.
#include "compiler/ir/ir_validator.h"

#include <gtest/gtest.h>

#include "tests/cpp/support/graph_builder.h"
#include "tests/cpp/support/graphs.h"

namespace kiln::compiler {
namespace {

using kiln::testing::MakeRequest;

absl::StatusCode Check(const kiln::v1::CompileRequest& request) {
  return ValidateRequest(request, OpAllowlist::Default()).code();
}

TEST(IrValidator, WellFormedRequestPasses) {
  absl::Status s = ValidateRequest(MakeRequest(), OpAllowlist::Default());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(IrValidator, OpOffTheAllowlistIsRejectedWithItsNode) {
  auto request = MakeRequest();
  request.mutable_graph()->mutable_nodes(1)->set_op("aten::_run_python_code");
  absl::Status s = ValidateRequest(request, OpAllowlist::Default());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("node 1"), std::string::npos) << s;
}

TEST(IrValidator, AllowlistIsExtensible) {
  auto request = MakeRequest();
  request.mutable_graph()->mutable_nodes(1)->set_op("aten::my_new_op");
  OpAllowlist ops = OpAllowlist::Default();
  ops.Add("aten::my_new_op");
  EXPECT_TRUE(ValidateRequest(request, ops).ok());
}

TEST(IrValidator, AFunctionalOpOffTheAllowlistPassesWithItsDeclaredSchema) {
  auto request = MakeRequest();
  request.mutable_graph()->mutable_nodes(1)->set_op("aten::softshrink");
  absl::Status s = ValidateRequest(request, OpAllowlist::Default());
  EXPECT_NE(std::string(s.message()).find("node 1: op 'aten::softshrink' is not on the allowlist"),
            std::string::npos)
      << s;
  auto* declared = request.mutable_graph()->add_schemas();
  declared->set_op("aten::softshrink");
  declared->set_schema("aten::softshrink(Tensor self, Scalar lambd=0.5) -> Tensor");
  s = ValidateRequest(request, OpAllowlist::Default());
  EXPECT_TRUE(s.ok()) << s;
  // Declaring an in-place schema does not make the node admissible.
  declared->set_op("aten::relu_");
  declared->set_schema("aten::relu_(Tensor(a!) self) -> Tensor(a!)");
  request.mutable_graph()->mutable_nodes(1)->set_op("aten::relu_");
  s = ValidateRequest(request, OpAllowlist::Default());
  EXPECT_NE(std::string(s.message()).find("writes its argument 'self'"), std::string::npos) << s;
}

TEST(IrValidator, DeclaredSchemasMustParseBeNamedForTheirOpAndDeclaredOnce) {
  auto request = MakeRequest();
  auto* declared = request.mutable_graph()->add_schemas();
  declared->set_op("aten::relu");
  declared->set_schema("aten::relu(Tensor self) -> Tensor");
  EXPECT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
  auto twice = request;
  *twice.mutable_graph()->add_schemas() = *declared;
  EXPECT_NE(std::string(ValidateRequest(twice, OpAllowlist::Default()).message()).find("twice"),
            std::string::npos);
  auto misnamed = request;
  misnamed.mutable_graph()->mutable_schemas(0)->set_schema("aten::gelu(Tensor self) -> Tensor");
  EXPECT_EQ(Check(misnamed), absl::StatusCode::kInvalidArgument);
  auto garbled = request;
  garbled.mutable_graph()->mutable_schemas(0)->set_schema("aten::relu(Tensor self");
  EXPECT_EQ(Check(garbled), absl::StatusCode::kInvalidArgument);
  auto tagged = request;
  tagged.mutable_graph()->mutable_schemas(0)->add_tags(std::string(65, 't'));
  EXPECT_EQ(Check(tagged), absl::StatusCode::kInvalidArgument);
}

// x [4, 3] -> y = x + 1; x is updated with y.
kiln::testing::GraphBuilder UpdatingGraph(uint32_t* x, uint32_t* y) {
  using kiln::testing::F;
  using kiln::testing::V;
  kiln::testing::GraphBuilder b;
  *x = b.Input({4, 3});
  *y = b.Op("aten::add.Tensor", {V(*x), F(1.0)}, {4, 3});
  b.Output(*y);
  return b;
}

TEST(IrValidator, AnInputUpdateNamesAGraphInputOnceAndAValueOfItsDtypeAndSizes) {
  uint32_t x, y;
  auto ok = UpdatingGraph(&x, &y);
  ok.Update(x, y);
  absl::Status s = ValidateRequest(ok.Request(), OpAllowlist::Default());
  EXPECT_TRUE(s.ok()) << s;

  auto not_an_input = UpdatingGraph(&x, &y);
  not_an_input.Update(y, y);
  EXPECT_NE(std::string(ValidateRequest(not_an_input.Request(), OpAllowlist::Default()).message())
                .find("is not a graph input"),
            std::string::npos);
  auto twice = UpdatingGraph(&x, &y);
  twice.Update(x, y);
  twice.Update(x, x);
  EXPECT_EQ(Check(twice.Request()), absl::StatusCode::kInvalidArgument);
  auto undefined = UpdatingGraph(&x, &y);
  undefined.Update(x, 42);
  EXPECT_EQ(Check(undefined.Request()), absl::StatusCode::kInvalidArgument);

  auto other_sizes = UpdatingGraph(&x, &y);
  uint32_t row = 0;
  {
    using kiln::testing::I;
    using kiln::testing::V;
    row = other_sizes.Op("aten::select.int", {V(y), I(0), I(0)}, {3}, kiln::testing::kF32, {1});
  }
  other_sizes.Update(x, row);
  EXPECT_NE(std::string(ValidateRequest(other_sizes.Request(), OpAllowlist::Default()).message())
                .find("other sizes"),
            std::string::npos);
}

TEST(IrValidator, AnInputUpdateThatChangesTheLayoutGivesItsNewMetadata) {
  using kiln::testing::I;
  using kiln::testing::V;
  kiln::testing::GraphBuilder b;
  uint32_t x = b.Input({4, 3});
  uint32_t t = b.Op("aten::transpose.int", {V(x), I(0), I(1)}, {3, 4}, kiln::testing::kF32, {1, 3});
  b.Output(t);
  auto* u = b.Update(x, t);
  kiln::v1::TensorMeta* meta = u->mutable_new_meta();
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
  for (int64_t v : {3, 4}) meta->add_sizes(v);
  for (int64_t v : {1, 3}) meta->add_strides(v);
  absl::Status s = ValidateRequest(b.Request(), OpAllowlist::Default());
  EXPECT_TRUE(s.ok()) << s;
  meta->set_dtype(kiln::v1::DTYPE_FLOAT64);
  EXPECT_EQ(Check(b.Request()), absl::StatusCode::kInvalidArgument);
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->mutable_strides()->RemoveLast();
  EXPECT_EQ(Check(b.Request()), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, UseBeforeDefinitionIsRejected) {
  auto request = MakeRequest();
  request.mutable_graph()->mutable_nodes(0)->mutable_args(0)->set_value(7);
  EXPECT_EQ(Check(request), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, DuplicateValueIdIsRejected) {
  auto request = MakeRequest();
  request.mutable_graph()->mutable_nodes(1)->mutable_outputs(0)->set_id(1);
  EXPECT_EQ(Check(request), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, InconsistentMetadataIsRejected) {
  auto no_dtype = MakeRequest();
  no_dtype.mutable_graph()->mutable_inputs(0)->mutable_meta()->set_dtype(
      kiln::v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(Check(no_dtype), absl::StatusCode::kInvalidArgument);
  auto rank = MakeRequest();
  rank.mutable_graph()->mutable_inputs(0)->mutable_meta()->add_sizes(3);
  EXPECT_EQ(Check(rank), absl::StatusCode::kInvalidArgument);
  auto negative = MakeRequest();
  negative.mutable_graph()->mutable_inputs(0)->mutable_meta()->set_sizes(0, -1);
  EXPECT_EQ(Check(negative), absl::StatusCode::kInvalidArgument);
  auto huge = MakeRequest();
  auto* meta = huge.mutable_graph()->mutable_inputs(0)->mutable_meta();
  meta->set_sizes(0, int64_t{1} << 40);
  meta->set_sizes(1, int64_t{1} << 40);
  EXPECT_EQ(Check(huge), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, ConstantMustHoldExactlyItsBytes) {
  auto request = MakeRequest();
  auto* constant = request.mutable_graph()->add_constants();
  constant->mutable_value()->set_id(10);
  kiln::testing::SetContiguous(constant->mutable_value()->mutable_meta(), {2, 2});
  constant->set_data(std::string(16, '\0'));
  EXPECT_TRUE(ValidateRequest(request, OpAllowlist::Default()).ok());
  constant->set_data(std::string(15, '\0'));
  EXPECT_EQ(Check(request), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, TargetMustBeKnownAndConsistent) {
  auto none = MakeRequest();
  none.clear_target();
  EXPECT_EQ(Check(none), absl::StatusCode::kInvalidArgument);
  auto cuda = MakeRequest();
  cuda.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CUDA);
  cuda.mutable_target()->clear_cpu_isa();
  cuda.mutable_target()->set_cuda_arch("sm_90");
  EXPECT_TRUE(ValidateRequest(cuda, OpAllowlist::Default()).ok());
  cuda.mutable_target()->set_cuda_arch("sm_90; rm -rf /");
  EXPECT_EQ(Check(cuda), absl::StatusCode::kInvalidArgument);
}

TEST(IrValidator, GraphWithoutOutputsOrDuplicateOptionsIsRejected) {
  auto no_outputs = MakeRequest();
  no_outputs.mutable_graph()->clear_outputs();
  EXPECT_EQ(Check(no_outputs), absl::StatusCode::kInvalidArgument);
  auto options = MakeRequest();
  for (int i = 0; i < 2; ++i) options.mutable_options()->add_extra()->set_key("same");
  EXPECT_EQ(Check(options), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::compiler

TEST(IrValidator, EmptyTensorWithHugeOtherSizesIsRejectedWithoutOverflow) {
  // [0, 2^62, 2^62]: numel 0, but the product of the other sizes overflows int64 in any code
  // that computes contiguous strides; validation bounds the nonzero sizes.
  auto request = kiln::testing::MakeRequest();
  auto* c = request.mutable_graph()->add_constants();
  c->mutable_value()->set_id(50);
  auto* meta = c->mutable_value()->mutable_meta();
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
  for (int64_t s : {int64_t{0}, int64_t{1} << 62, int64_t{1} << 62}) meta->add_sizes(s);
  for (int64_t s : {int64_t{1}, int64_t{1}, int64_t{1}}) meta->add_strides(s);
  EXPECT_EQ(kiln::compiler::ValidateRequest(request, kiln::compiler::OpAllowlist::Default()).code(),
            absl::StatusCode::kInvalidArgument);
}
