// DistinctKernels: kernels equal up to their own names are one function; nothing else is.
#include "compiler/codegen/distinct_kernels.h"

#include <gtest/gtest.h>

#include "tests/cpp/support/graph_builder.h"

namespace kiln::compiler {
namespace {

TEST(DistinctKernelsTest, TextsEqualUpToTheKernelsOwnNamesShareTheFirstFunction) {
  DistinctKernels d;
  EXPECT_EQ(d.Add("kiln_kernel_1", "void kiln_kernel_1_range() {}\nvoid kiln_kernel_1(x) {}"),
            "kiln_kernel_1");
  EXPECT_EQ(d.Add("kiln_kernel_3", "void kiln_kernel_3_range() {}\nvoid kiln_kernel_3(x) {}"),
            "kiln_kernel_1");
  EXPECT_EQ(d.Add("kiln_kernel_4", "void kiln_kernel_4_range() {}\nvoid kiln_kernel_4(y) {}"),
            "kiln_kernel_4");
}

TEST(DistinctKernelsTest, ANameThatIsAPrefixOfAnotherKernelsIsNotErasedFromIt) {
  DistinctKernels d;
  // kiln_kernel_1's text calls kiln_kernel_12: a different kernel from one calling kiln_kernel_13.
  EXPECT_EQ(d.Add("kiln_kernel_1", "kiln_kernel_1() { kiln_kernel_12(); }"), "kiln_kernel_1");
  EXPECT_EQ(d.Add("kiln_kernel_2", "kiln_kernel_2() { kiln_kernel_13(); }"), "kiln_kernel_2");
  EXPECT_EQ(d.Add("kiln_kernel_5", "kiln_kernel_5() { kiln_kernel_12(); }"), "kiln_kernel_1");
}

TEST(DistinctKernelsTest, LocalNamesNumberInputsThenNodeOutputsInGroupOrder) {
  kiln::testing::GraphBuilder b;
  uint32_t x = b.Input({4}), y = b.Input({4});
  uint32_t s = b.Op("aten::add.Tensor", {kiln::testing::V(x), kiln::testing::V(y)}, {4});
  uint32_t r = b.Op("aten::relu", {kiln::testing::V(s)}, {4});
  FusedGroup g;
  g.nodes = {0, 1};
  g.input_ids = {y, x};
  const LocalNames local(b.graph(), g);
  EXPECT_EQ(local.Number(y), 0);
  EXPECT_EQ(local.Number(x), 1);
  EXPECT_EQ(local.Number(s), 2);
  EXPECT_EQ(local.Number(r), 3);
  EXPECT_EQ(local("v", r), "v3");
}

}  // namespace
}  // namespace kiln::compiler
