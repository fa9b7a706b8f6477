// Cache keys: stable for equal requests, different whenever anything that changes the output
// differs.
#include "cache/cache_key.h"

#include <gtest/gtest.h>

#include "tests/cpp/support/graphs.h"

namespace kiln::cache {
namespace {

using kiln::testing::MakeRequest;

TEST(CacheKey, EqualRequestsShareAKey) {
  EXPECT_EQ(CacheKey(MakeRequest(), "v1"), CacheKey(MakeRequest(), "v1"));
  EXPECT_TRUE(IsWellFormedKey(CacheKey(MakeRequest(), "v1")));
}

TEST(CacheKey, OptionOrderDoesNotMatter) {
  auto a = MakeRequest();
  auto b = MakeRequest();
  auto* o = a.mutable_options()->add_extra();
  o->set_key("x");
  o->set_value("1");
  o = a.mutable_options()->add_extra();
  o->set_key("y");
  o->set_value("2");
  o = b.mutable_options()->add_extra();
  o->set_key("y");
  o->set_value("2");
  o = b.mutable_options()->add_extra();
  o->set_key("x");
  o->set_value("1");
  EXPECT_EQ(CacheKey(a, "v1"), CacheKey(b, "v1"));
}

TEST(CacheKey, EverythingThatChangesOutputChangesTheKey) {
  const std::string base = CacheKey(MakeRequest(), "v1");
  EXPECT_NE(base, CacheKey(MakeRequest(), "v2"));
  EXPECT_NE(base, CacheKey(MakeRequest(1), "v1"));
  auto dtype = MakeRequest();
  dtype.mutable_graph()->mutable_inputs(0)->mutable_meta()->set_dtype(kiln::v1::DTYPE_FLOAT64);
  EXPECT_NE(base, CacheKey(dtype, "v1"));
  auto strides = MakeRequest();
  strides.mutable_graph()->mutable_inputs(0)->mutable_meta()->set_strides(0, 5);
  EXPECT_NE(base, CacheKey(strides, "v1"));
  auto isa = MakeRequest();
  isa.mutable_target()->set_cpu_isa("x86-64-v4");
  EXPECT_NE(base, CacheKey(isa, "v1"));
  auto mode = MakeRequest();
  mode.mutable_options()->set_mode("max-autotune");
  EXPECT_NE(base, CacheKey(mode, "v1"));
  auto grad = MakeRequest();
  grad.mutable_graph()->mutable_inputs(0)->mutable_meta()->set_requires_grad(true);
  EXPECT_NE(base, CacheKey(grad, "v1"));
}

TEST(CacheKey, RejectsMalformedKeys) {
  EXPECT_FALSE(IsWellFormedKey(""));
  EXPECT_FALSE(IsWellFormedKey(std::string(64, 'G')));
  EXPECT_FALSE(IsWellFormedKey(std::string(63, 'a')));
  EXPECT_FALSE(IsWellFormedKey("../../etc/passwd"));
}

}  // namespace
}  // namespace kiln::cache
