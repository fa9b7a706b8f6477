// IR validation: the sample graph passes; each kind of malformed request is InvalidArgument.
#include "compiler/ir/ir_validator.h"

#include <gtest/gtest.h>

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
