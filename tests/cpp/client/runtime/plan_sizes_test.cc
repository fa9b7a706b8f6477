// PlanSizes: symbols bound from the inputs and checked against their ranges, expressions
// evaluated with overflow checks, malformed symbols refused when the plan is built.
#include "runtime/plan_sizes.h"

#include <gtest/gtest.h>

#include <map>

namespace kiln::runtime {
namespace {

SymExprSpec Expr(std::vector<SymTermSpec> terms) { return {std::move(terms)}; }

// Inputs 10 and 11 per call; s0 = input 11's dim 1 in [2, 64], s5 = input 10's dim 0 in [1, inf).
PlanSizes Sizes() {
  StatusOr<PlanSizes> sizes =
      PlanSizes::Create({{0, 11, 1, 2, 64}, {5, 10, 0, 1, 0}}, {10, 11});
  EXPECT_TRUE(sizes.ok()) << sizes.status().ToString();
  return *sizes;
}

std::function<std::optional<int64_t>(size_t, uint32_t)> Shapes(
    std::map<size_t, std::vector<int64_t>> shapes) {
  return [shapes](size_t input, uint32_t dim) -> std::optional<int64_t> {
    const auto& s = shapes.at(input);
    if (dim >= s.size()) return std::nullopt;
    return s[dim];
  };
}

TEST(PlanSizes, SymbolsAreReadFromTheInputsAndExpressionsEvaluated) {
  PlanSizes sizes = Sizes();
  StatusOr<std::vector<int64_t>> values = sizes.Bind(Shapes({{0, {7, 3}}, {1, {4, 9}}}));
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_EQ(*values, (std::vector<int64_t>{9, 7}));
  // 3 + 2 * s0 * s5 - s5^2 = 3 + 126 - 49
  StatusOr<SizeExpr> e = sizes.Compile(Expr({{3, {}}, {2, {0, 5}}, {-1, {5, 5}}}));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*PlanSizes::Evaluate(*e, *values), 80);
  EXPECT_EQ(*PlanSizes::Evaluate(*sizes.Compile(Expr({})), *values), 0);
}

TEST(PlanSizes, AValueOutsideItsRangeOrAMissingDimensionIsAnError) {
  PlanSizes sizes = Sizes();
  Status high = sizes.Bind(Shapes({{0, {7}}, {1, {4, 65}}})).status();
  EXPECT_NE(high.message().find("size symbol 0 is 65, outside [2, 64]"), std::string::npos)
      << high.ToString();
  Status low = sizes.Bind(Shapes({{0, {0}}, {1, {4, 8}}})).status();
  EXPECT_NE(low.message().find("size symbol 5 is 0, outside [1, inf]"), std::string::npos)
      << low.ToString();
  Status missing = sizes.Bind(Shapes({{0, {3}}, {1, {4}}})).status();
  EXPECT_NE(missing.message().find("has no dimension 1"), std::string::npos)
      << missing.ToString();
}

TEST(PlanSizes, OverflowIsAnErrorNotAWrappedSize) {
  PlanSizes sizes = Sizes();
  const std::vector<int64_t> values{int64_t{1} << 40, int64_t{1} << 30};
  StatusOr<SizeExpr> product = sizes.Compile(Expr({{1, {0, 5}}}));
  EXPECT_FALSE(PlanSizes::Evaluate(*product, values).ok());
  StatusOr<SizeExpr> sum = sizes.Compile(Expr({{INT64_MAX, {}}, {1, {5}}}));
  EXPECT_FALSE(PlanSizes::Evaluate(*sum, values).ok());
}

TEST(PlanSizes, MalformedSymbolsAndExpressionsAreRefused) {
  EXPECT_FALSE(PlanSizes::Create({{0, 11, 0, 2, 0}, {0, 10, 0, 2, 0}}, {10, 11}).ok());
  EXPECT_FALSE(PlanSizes::Create({{0, 12, 0, 2, 0}}, {10, 11}).ok());  // not a per-call input
  EXPECT_FALSE(PlanSizes::Create({{0, 10, 0, 5, 4}}, {10, 11}).ok());  // max < min
  EXPECT_FALSE(PlanSizes::Create({{0, 10, 0, -1, 0}}, {10, 11}).ok());
  PlanSizes sizes = Sizes();
  EXPECT_FALSE(sizes.Compile(Expr({{1, {3}}})).ok());  // undeclared
  EXPECT_FALSE(sizes.Compile(Expr({{0, {0}}})).ok());  // zero coefficient
}

TEST(PlanSizes, ExampleValuesSatisfyEveryRange) {
  StatusOr<PlanSizes> sizes =
      PlanSizes::Create({{0, 10, 0, 0, 0}, {1, 10, 1, 5, 9}, {2, 10, 2, 1, 1}}, {10});
  ASSERT_TRUE(sizes.ok());
  EXPECT_EQ(sizes->ExampleValues(), (std::vector<int64_t>{2, 5, 1}));
}

}  // namespace
}  // namespace kiln::runtime
