// ParseOpSchema on the schema texts torch prints: names, types, alias annotations, keyword-only
// arguments, defaults that hold commas and quotes, tuple and empty returns; malformed text is
// refused rather than half read.
#include "compiler/ir/op_schema.h"

#include <gtest/gtest.h>

namespace kiln::compiler {
namespace {

TEST(OpSchemaTest, ReadsTheNameEveryArgumentAndEveryNamedResult) {
  auto s = ParseOpSchema(
      "aten::nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, "
      "SymInt ignore_index) -> (Tensor output, Tensor total_weight)");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->name, "aten::nll_loss_forward");
  ASSERT_EQ(s->arguments.size(), 5u);
  EXPECT_EQ(s->arguments[2].type, "Tensor?");
  EXPECT_EQ(s->arguments[2].name, "weight");
  EXPECT_EQ(s->arguments[4].type, "SymInt");
  ASSERT_EQ(s->returns.size(), 2u);
  EXPECT_EQ(s->returns[1].type, "Tensor");
  EXPECT_EQ(s->returns[1].name, "total_weight");
  for (const SchemaSlot& slot : s->arguments) EXPECT_FALSE(slot.aliased || slot.written);
}

TEST(OpSchemaTest, AliasAnnotationsAreReadOffTheirTypes) {
  auto inplace = ParseOpSchema(
      "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)");
  ASSERT_TRUE(inplace.has_value());
  EXPECT_EQ(inplace->name, "aten::add_.Tensor");
  EXPECT_TRUE(inplace->arguments[0].written);
  EXPECT_EQ(inplace->arguments[0].type, "Tensor");
  EXPECT_FALSE(inplace->arguments[1].aliased);
  EXPECT_TRUE(inplace->arguments[2].keyword_only);
  EXPECT_TRUE(inplace->returns[0].aliased && inplace->returns[0].written);

  auto view = ParseOpSchema("aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)");
  ASSERT_TRUE(view.has_value());
  EXPECT_TRUE(view->arguments[0].aliased);
  EXPECT_FALSE(view->arguments[0].written);
  EXPECT_EQ(view->arguments[1].type, "SymInt[]");

  auto split = ParseOpSchema(
      "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]");
  ASSERT_TRUE(split.has_value());
  EXPECT_TRUE(split->arguments[0].aliased);
  EXPECT_EQ(split->returns[0].type, "Tensor[]");
  EXPECT_TRUE(split->returns[0].aliased);
}

TEST(OpSchemaTest, DefaultsWithCommasOrQuotesDoNotSplitAnArgument) {
  auto s = ParseOpSchema(
      "aten::conv(Tensor input, int[2] stride=[1, 1], str padding=\"a, (b\", *, "
      "float? scale=None, str how='x)') -> ()");
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->arguments.size(), 5u);
  EXPECT_EQ(s->arguments[1].type, "int[2]");
  EXPECT_EQ(s->arguments[1].name, "stride");
  EXPECT_EQ(s->arguments[2].name, "padding");
  EXPECT_FALSE(s->arguments[2].keyword_only);
  EXPECT_TRUE(s->arguments[3].keyword_only);
  EXPECT_EQ(s->arguments[4].name, "how");
  EXPECT_TRUE(s->returns.empty());
}

TEST(OpSchemaTest, ResultsMixingTensorsAndSizesAreEachRead) {
  auto s = ParseOpSchema(
      "aten::_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, "
      "float dropout_p=0., bool is_causal=False, bool return_debug_mask=False, *, "
      "float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor cum_seq_q, "
      "Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor rng_state, Tensor unused, "
      "Tensor debug_attn_mask)");
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->returns.size(), 9u);
  EXPECT_EQ(ClassifyResult(s->returns[4].type), ResultKind::kNumber);
  EXPECT_EQ(ClassifyResult(s->returns[8].type), ResultKind::kTensor);
}

TEST(OpSchemaTest, ResultKinds) {
  EXPECT_EQ(ClassifyResult("Tensor"), ResultKind::kTensor);
  EXPECT_EQ(ClassifyResult("Tensor?"), ResultKind::kTensor);
  EXPECT_EQ(ClassifyResult("Tensor[]"), ResultKind::kTensorList);
  for (const char* number : {"int", "SymInt", "float", "bool"}) {
    EXPECT_EQ(ClassifyResult(number), ResultKind::kNumber) << number;
  }
  for (const char* other : {"Scalar", "str", "int[]", "ScalarType", "Tensor?[]"}) {
    EXPECT_EQ(ClassifyResult(other), ResultKind::kOther) << other;
  }
}

TEST(OpSchemaTest, MalformedTextIsRefused) {
  for (const char* text : {"", "aten::relu", "(Tensor self) -> Tensor", "aten::relu(Tensor self",
                           "aten::relu(Tensor self) Tensor", "aten::relu(Tensor self) ->",
                           "aten::relu(Tensor(a self) -> Tensor", "aten::relu(Tensor) -> Tensor",
                           "aten::relu(int[2 x) -> Tensor", "aten::relu(str s=\"open) -> Tensor",
                           "aten::relu(Tensor self) -> (Tensor"}) {
    EXPECT_FALSE(ParseOpSchema(text).has_value()) << text;
  }
}

}  // namespace
}  // namespace kiln::compiler
