// AdmitOp: the allowlist, then the rule over a declared schema. Each refusal says why, so that a
// client's log names what kept its graph from compiling.
#include "compiler/ir/op_admission.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::compiler {
namespace {

kiln::v1::Node NodeOf(const std::string& op, int outputs = 1) {
  kiln::v1::Node node;
  node.set_op(op);
  for (int i = 0; i < outputs; ++i) node.add_outputs()->set_id(i);
  return node;
}

kiln::v1::OpSchema Declared(const std::string& op, const std::string& schema,
                            std::vector<std::string> tags = {}) {
  kiln::v1::OpSchema declared;
  declared.set_op(op);
  declared.set_schema(schema);
  for (auto& tag : tags) declared.add_tags(tag);
  return declared;
}

// The refusal's message, or "" when `op` with `schema` is admitted.
std::string Refusal(const std::string& op, const std::string& schema, int outputs = 1,
                    std::vector<std::string> tags = {}) {
  const kiln::v1::OpSchema declared = Declared(op, schema, std::move(tags));
  absl::Status s = AdmitOp(NodeOf(op, outputs), OpAllowlist::Default(), &declared);
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  }
  return std::string(s.message());
}

TEST(OpAdmissionTest, AnAllowlistedOpNeedsNoSchema) {
  for (const char* op : {"aten::add.Tensor", "aten::nll_loss_forward", "aten::constant_pad_nd",
                         "aten::native_dropout", "aten::embedding_dense_backward",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}) {
    EXPECT_TRUE(AdmitOp(NodeOf(op), OpAllowlist::Default(), nullptr).ok()) << op;
  }
}

TEST(OpAdmissionTest, AFunctionalAtenOpIsAdmittedByItsDeclaredSchema) {
  EXPECT_EQ(Refusal("aten::select_backward",
                    "aten::select_backward(Tensor grad_output, SymInt[] input_sizes, int dim, "
                    "SymInt index) -> Tensor"),
            "");
  // Tensors beside sizes, one output per tensor; random ops too (the compiler keeps their order).
  EXPECT_EQ(Refusal("aten::_my_attention",
                    "aten::_my_attention(Tensor q, float p=0., *, Generator? generator=None) -> "
                    "(Tensor output, SymInt max_q, Tensor logsumexp)",
                    2, {"nondeterministic_seeded", "pt2_compliant_tag"}),
            "");
  EXPECT_EQ(Refusal("aten::unbind_copy.int",
                    "aten::unbind_copy.int(Tensor self, int dim=0) -> Tensor[]", 5),
            "");
}

TEST(OpAdmissionTest, AnOpWithoutADeclaredSchemaIsRefused) {
  absl::Status s = AdmitOp(NodeOf("aten::my_new_op"), OpAllowlist::Default(), nullptr);
  EXPECT_NE(std::string(s.message()).find("declares no schema"), std::string::npos) << s;
}

TEST(OpAdmissionTest, OnlyAtenOpsAreAdmittedByTheirSchema) {
  EXPECT_NE(Refusal("builtins::exec", "builtins::exec(str code) -> Tensor").find("not an aten op"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::bad name", "aten::bad name(Tensor x) -> Tensor").find("not an aten op"),
            std::string::npos);
}

TEST(OpAdmissionTest, WritesViewsAndUnbindableTypesAreRefusedWithTheirReason) {
  EXPECT_NE(Refusal("aten::my_op_", "aten::my_op_(Tensor(a!) self) -> Tensor(a!)")
                .find("writes its argument 'self'"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_view", "aten::my_view(Tensor(a) self) -> Tensor(a)")
                .find("view of its argument 'self'"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_sync", "aten::my_sync(Tensor self, Stream s) -> Tensor")
                .find("of type Stream"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_rand", "aten::my_rand(Tensor self, Generator generator) -> Tensor")
                .find("of type Generator"),
            std::string::npos);
  EXPECT_NE(
      Refusal("aten::my_item", "aten::my_item(Tensor self) -> Scalar").find("returns a Scalar"),
      std::string::npos);
  EXPECT_NE(Refusal("aten::my_size", "aten::my_size(Tensor self) -> int").find("returns no tensor"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_pair", "aten::my_pair(Tensor self) -> (Tensor, Tensor)", 3)
                .find("returns 2 tensors, the node defines 3"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_op", "aten::my_op(Tensor self").find("does not parse"),
            std::string::npos);
}

TEST(OpAdmissionTest, TagsThatSayTheHostReadsValuesOrMetadataChangesAreRefused) {
  EXPECT_NE(Refusal("aten::my_select", "aten::my_select(Tensor self, Tensor mask) -> Tensor", 1,
                    {"dynamic_output_shape"})
                .find("tagged dynamic_output_shape"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_value", "aten::my_value(Tensor self) -> Tensor", 1,
                    {"data_dependent_output"})
                .find("tagged data_dependent_output"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::my_view", "aten::my_view(Tensor self) -> Tensor", 1, {"inplace_view"})
                .find("tagged inplace_view"),
            std::string::npos);
}

TEST(OpAdmissionTest, TheDenylistRefusesOpsWithEffectsWhateverTheirSchemaSays) {
  EXPECT_NE(Refusal("aten::nonzero", "aten::nonzero(Tensor self) -> Tensor").find("is denied"),
            std::string::npos);
  EXPECT_NE(Refusal("aten::_copy_from",
                    "aten::_copy_from(Tensor self, Tensor dst, bool non_blocking=False) -> Tensor")
                .find("does not mark"),
            std::string::npos);
  EXPECT_NE(
      Refusal("aten::from_file", "aten::from_file(str filename) -> Tensor").find("reads a file"),
      std::string::npos);
  EXPECT_NE(DeniedBecause("aten::_local_scalar_dense"), "");
  EXPECT_NE(DeniedBecause("aten::_test_warn_in_autograd"), "");
  // By overload: repeat_interleave of a tensor of counts sizes its result by them; of an int, not.
  EXPECT_NE(DeniedBecause("aten::repeat_interleave.Tensor"), "");
  EXPECT_EQ(DeniedBecause("aten::repeat_interleave.self_int"), "");
  EXPECT_EQ(DeniedBecause("aten::nll_loss_forward"), "");
}

}  // namespace
}  // namespace kiln::compiler
