// DecodePlan against libprotobuf, the parser kilnd's plans are written for: every field of a rich
// plan decodes to what protobuf parses; every prefix and thousands of garbled copies of it are
// either refused by both or decoded alike; unknown fields, unpacked lists and oneof rules follow
// protobuf; errors name the field and the byte.
#include "runtime/plan_decoder.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <variant>

#include "kiln/v1/artifact.pb.h"
#include "tests/cpp/support/plan_spec_from_proto.h"
#if __has_include(<google/protobuf/stubs/logging.h>)
#include <google/protobuf/stubs/logging.h>
#define KILN_HAS_LOG_SILENCER 1
#endif

namespace kiln::runtime {
namespace {

using kiln::testing::Dump;
using kiln::testing::FromProto;

static_assert(static_cast<int>(WireDType::kBFloat16) == kiln::v1::DTYPE_BFLOAT16);
static_assert(static_cast<int>(WireDType::kComplex128) == kiln::v1::DTYPE_COMPLEX128);
static_assert(static_cast<int>(WireDType::kUInt64) == kiln::v1::DTYPE_UINT64);
static_assert(static_cast<int>(WireDeviceKind::kCuda) == kiln::v1::DEVICE_KIND_CUDA);
static_assert(static_cast<int>(WireMemoryFormat::kChannelsLast3d) ==
              kiln::v1::MEMORY_FORMAT_CHANNELS_LAST_3D);
static_assert(static_cast<int>(WireLayout::kStrided) == kiln::v1::LAYOUT_STRIDED);

// ---- a plan that uses every field the decoder reads, and some it skips ----

void SetMeta(kiln::v1::TensorMeta* m, kiln::v1::DType dtype, std::vector<int64_t> sizes,
             std::vector<int64_t> strides, int64_t offset = 0) {
  m->set_dtype(dtype);
  for (int64_t s : sizes) m->add_sizes(s);
  for (int64_t s : strides) m->add_strides(s);
  m->set_storage_offset(offset);
  m->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);  // skipped by the decoder
  m->set_requires_grad(true);                                // skipped by the decoder
}

kiln::v1::ExecutionPlan RichPlan() {
  kiln::v1::ExecutionPlan p;
  for (uint32_t id : {0u, 1u, 300u}) p.add_inputs(id);
  for (uint32_t id = 0; id < 8; ++id) {
    auto* v = p.add_values();
    v->set_id(id == 2 ? 300 : id);
    SetMeta(v->mutable_meta(), id == 5 ? kiln::v1::DTYPE_INT64 : kiln::v1::DTYPE_FLOAT32, {4, 3},
            {3, 1}, id == 6 ? 2 : 0);
  }
  auto* c = p.add_constants();
  c->mutable_value()->set_id(7);
  SetMeta(c->mutable_value()->mutable_meta(), kiln::v1::DTYPE_FLOAT32, {4, 3}, {3, 1});
  c->set_data(std::string(48, '\x01'));

  auto* pro = p.add_prologue()->mutable_library();
  pro->set_op("aten::neg");
  pro->add_args()->set_value(7);
  pro->add_outputs(4);
  p.add_prologue_outputs(4);

  auto* k = p.add_steps();
  k->mutable_kernel()->set_symbol("kiln_kernel_0");
  for (uint32_t a : {0u, 4u, 3u}) k->mutable_kernel()->add_args(a);
  k->mutable_kernel()->add_writes(3);
  for (uint32_t g : {130u, 2u}) k->mutable_kernel()->add_grid(g);  // A CUDA launch's
  for (uint32_t b : {128u, 1u, 1u}) k->mutable_kernel()->add_block(b);
  k->mutable_kernel()->set_shared_memory_bytes(64 * 1024);
  k->add_release(4);

  auto* l = p.add_steps();
  auto* call = l->mutable_library();
  call->set_op("aten::_to_copy");
  auto* a = call->add_args();
  a->set_value(3);
  a = call->add_args();
  a->set_name("dtype");
  a->set_dtype_value(kiln::v1::DTYPE_FLOAT64);
  a = call->add_args();
  a->set_name("layout");
  a->set_layout_value(kiln::v1::LAYOUT_STRIDED);
  a = call->add_args();
  a->set_name("device");
  a->mutable_device_value()->set_kind(kiln::v1::DEVICE_KIND_CUDA);
  a->mutable_device_value()->set_index(3);
  a = call->add_args();
  a->set_name("memory_format");
  a->set_memory_format_value(kiln::v1::MEMORY_FORMAT_CHANNELS_LAST);
  a = call->add_args();
  a->set_name("pin_memory");
  a->mutable_none();
  a = call->add_args();
  a->set_int_value(-5);
  a = call->add_args();
  a->set_float_value(-2.5);
  a = call->add_args();
  a->set_bool_value(true);
  a = call->add_args();
  for (int64_t v : {int64_t{-1}, int64_t{0}, int64_t{1} << 40})
    a->mutable_int_list()->add_values(v);
  a = call->add_args();
  for (uint32_t v : {0u, 1u}) a->mutable_value_list()->add_ids(v);
  a = call->add_args();
  a->set_string_value("floor");
  call->add_outputs(5);
  call->add_outputs(6);
  call->set_schema("aten::_to_copy(Tensor self, *, ScalarType? dtype=None) -> Tensor");
  l->add_release(3);

  auto* b = p.add_buffers();
  b->set_id(3);
  b->set_in_arena(true);
  b->set_arena_offset(128);
  p.set_arena_bytes(1ULL << 33);
  for (uint32_t id : {5u, 0u, 5u}) p.add_outputs(id);
  auto* update = p.add_input_updates();
  update->set_input(1);
  update->set_value(6);
  auto* restrided = p.add_input_updates();
  restrided->set_input(300);
  restrided->set_value(5);
  SetMeta(restrided->mutable_new_meta(), kiln::v1::DTYPE_FLOAT32, {3, 4}, {1, 3}, 1);
  // Size symbols: a symbolic value, SymInt arguments, a kernel's runtime sizes and grid.
  auto* symbol = p.add_size_symbols();
  symbol->set_id(3);
  symbol->set_input(1);
  symbol->set_dim(0);
  symbol->set_min(2);
  symbol->set_max(int64_t{1} << 40);
  auto term = [](kiln::v1::SymExpr* e, int64_t c, std::vector<uint32_t> symbols) {
    auto* t = e->add_terms();
    t->set_coefficient(c);
    for (uint32_t y : symbols) t->add_symbols(y);
  };
  auto* sym_meta = p.mutable_values(1)->mutable_meta();
  term(sym_meta->add_size_exprs(), 1, {3});
  term(sym_meta->add_size_exprs(), 3, {});
  term(sym_meta->add_stride_exprs(), 3, {});
  sym_meta->add_stride_exprs();  // 0: no terms
  a = call->add_args();
  term(a->mutable_sym_int_value(), -7, {3, 3});
  term(a->mutable_sym_int_value(), 1, {});
  a = call->add_args();
  term(a->mutable_sym_int_list()->add_values(), 2, {3});
  a->mutable_sym_int_list()->add_values();
  auto* launch = p.mutable_steps(0)->mutable_kernel();
  term(launch->add_size_args(), 12, {3});
  term(launch->mutable_grid_work(), 4, {3});
  launch->set_grid_work_per_block(256);
  launch->set_grid_max(1 << 20);
  return p;
}

// Decodes `bytes` with both parsers; fails the test when protobuf accepts bytes DecodePlan
// refuses, or when both accept and disagree. (DecodePlan may accept what protobuf refuses:
// protobuf also checks that strings are UTF-8.)
void ExpectAgrees(const std::string& bytes, const std::string& what) {
  StatusOr<PlanSpec> mine = DecodePlan(bytes);
  kiln::v1::ExecutionPlan parsed;
#ifdef KILN_HAS_LOG_SILENCER
  google::protobuf::LogSilencer quiet;  // protobuf logs every string that is not UTF-8
#endif
  if (!parsed.ParseFromString(bytes)) return;
  std::optional<PlanSpec> expected = FromProto(parsed);
  if (!expected) {
    EXPECT_FALSE(mine.ok()) << what << ": a step without a kind was accepted";
    return;
  }
  ASSERT_TRUE(mine.ok()) << what << ": " << mine.status().ToString();
  ASSERT_EQ(Dump(*mine), Dump(*expected)) << what;
}

TEST(PlanDecoderTest, EveryFieldDecodesAsProtobufParsesIt) {
  const std::string bytes = RichPlan().SerializeAsString();
  StatusOr<PlanSpec> spec = DecodePlan(bytes);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(Dump(*spec), Dump(*FromProto(RichPlan())));
  // A few fields spelled out, so that a bug shared by Dump and FromProto cannot hide.
  EXPECT_EQ(spec->inputs, (std::vector<uint32_t>{0, 1, 300}));
  EXPECT_EQ(spec->arena_bytes, 1ULL << 33);
  ASSERT_EQ(spec->steps.size(), 2u);
  const auto& call = std::get<LibraryStepSpec>(spec->steps[1]);
  EXPECT_EQ(call.args[3].kind, CallArg::Kind::kDevice);
  EXPECT_EQ(call.args[3].device.kind, WireDeviceKind::kCuda);
  EXPECT_EQ(call.args[3].device.index, 3);
  EXPECT_EQ(call.args[7].f, -2.5);
  EXPECT_EQ(call.args[9].list, (std::vector<int64_t>{-1, 0, 1LL << 40}));
  EXPECT_EQ(spec->constants[0].data, std::string(48, '\x01'));
  EXPECT_EQ(std::get<KernelStepSpec>(spec->steps[0]).release, (std::vector<uint32_t>{4}));
  EXPECT_EQ(call.schema, "aten::_to_copy(Tensor self, *, ScalarType? dtype=None) -> Tensor");
  ASSERT_EQ(spec->input_updates.size(), 2u);
  EXPECT_EQ(spec->input_updates[0].value, 6u);
  EXPECT_FALSE(spec->input_updates[0].has_new_meta);
  EXPECT_TRUE(spec->input_updates[1].has_new_meta);
  EXPECT_EQ(spec->input_updates[1].new_meta.strides, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(spec->input_updates[1].new_meta.storage_offset, 1);
  ASSERT_EQ(spec->size_symbols.size(), 1u);
  EXPECT_EQ(spec->size_symbols[0].id, 3u);
  EXPECT_EQ(spec->size_symbols[0].max, int64_t{1} << 40);
  const MetaSpec& sym_meta = spec->values[1].meta;
  ASSERT_EQ(sym_meta.size_exprs.size(), 2u);
  EXPECT_EQ(sym_meta.size_exprs[0].terms[0].symbols, (std::vector<uint32_t>{3}));
  EXPECT_TRUE(sym_meta.stride_exprs[1].terms.empty());
  ASSERT_EQ(call.args[12].kind, CallArg::Kind::kSymInt);
  ASSERT_EQ(call.args[12].exprs[0].terms.size(), 2u);
  EXPECT_EQ(call.args[12].exprs[0].terms[0].coefficient, -7);
  EXPECT_EQ(call.args[12].exprs[0].terms[0].symbols, (std::vector<uint32_t>{3, 3}));
  ASSERT_EQ(call.args[13].kind, CallArg::Kind::kSymInts);
  EXPECT_EQ(call.args[13].exprs.size(), 2u);
  const auto& launch = std::get<KernelStepSpec>(spec->steps[0]);
  ASSERT_EQ(launch.size_args.size(), 1u);
  EXPECT_EQ(launch.size_args[0].terms[0].coefficient, 12);
  EXPECT_TRUE(launch.has_grid_work);
  EXPECT_EQ(launch.grid_work_per_block, 256u);
  EXPECT_EQ(launch.grid_max, 1u << 20);
}

TEST(PlanDecoderTest, EmptyBytesAreAnEmptyPlan) {
  StatusOr<PlanSpec> spec = DecodePlan("");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->steps.empty() && spec->values.empty() && spec->inputs.empty());
}

TEST(PlanDecoderTest, EveryPrefixIsRefusedOrDecodedAsProtobufDoes) {
  const std::string bytes = RichPlan().SerializeAsString();
  int refused = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);
    ExpectAgrees(prefix, "prefix of " + std::to_string(n) + " bytes");
    refused += DecodePlan(prefix).ok() ? 0 : 1;
  }
  EXPECT_GT(refused, static_cast<int>(bytes.size()) / 2);  // Most cut a field in two.
}

TEST(PlanDecoderTest, GarbledCopiesAreRefusedOrDecodedAsProtobufDoes) {
  const std::string bytes = RichPlan().SerializeAsString();
  std::mt19937 rng(20240611);
  for (int round = 0; round < 20000; ++round) {
    std::string garbled = bytes;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % garbled.size();
      switch (rng() % 4) {
        case 0:  // flip bits
          garbled[at] = static_cast<char>(garbled[at] ^ (1 << (rng() % 8)));
          break;
        case 1:  // a random byte
          garbled[at] = static_cast<char>(rng());
          break;
        case 2:  // drop a byte
          garbled.erase(at, 1);
          break;
        default:  // insert one
          garbled.insert(at, 1, static_cast<char>(rng()));
          break;
      }
      if (garbled.empty()) break;
    }
    ExpectAgrees(garbled, "round " + std::to_string(round));
    if (HasFatalFailure() || HasFailure()) return;
  }
}

TEST(PlanDecoderTest, UnpackedListsUnknownFieldsAndGroupsReadAsProtobufReadsThem) {
  // inputs (1) unpacked: 5, then a packed run 7, 9; arena_bytes (8) given twice: the last wins;
  // unknown fields: 99 varint, 100 fixed32, 101 fixed64, 102 bytes, 103 a group holding a nested
  // group; arena_bytes with a wrong wire type (bytes): unknown, skipped.
  const std::string bytes = std::string("\x08\x05", 2) + std::string("\x0a\x02\x07\x09", 4) +
                            std::string("\x40\x01\x40\x02", 4) + std::string("\x98\x06\x7f", 3) +
                            std::string("\xa5\x06\x01\x02\x03\x04", 6) +
                            std::string("\xa9\x06\x01\x02\x03\x04\x05\x06\x07\x08", 10) +
                            std::string("\xb2\x06\x02\xff\xff", 5) +
                            std::string("\xbb\x06\x08\x01\xc3\x06\xc4\x06\xbc\x06", 10) +
                            std::string("\x42\x01\x00", 3);
  ExpectAgrees(bytes, "hand-encoded plan");
  StatusOr<PlanSpec> spec = DecodePlan(bytes);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->inputs, (std::vector<uint32_t>{5, 7, 9}));
  EXPECT_EQ(spec->arena_bytes, 2u);
}

TEST(PlanDecoderTest, TagsReadAsProtobufReadsThem) {
  // A 5-byte tag whose last byte has bits past 32: protobuf drops them (here: field 2^25, an
  // unknown varint), found by fuzz_plan_decoder.
  const std::string overlong("\x80\x80\x80\x80\x31\x12\x80\x80\xce\x40\x01", 11);
  ExpectAgrees(overlong, "5-byte tag");
  EXPECT_TRUE(DecodePlan(overlong.substr(0, 6)).ok());
  // A sixth byte is one too many for protobuf and for DecodePlan.
  StatusOr<PlanSpec> six = DecodePlan(std::string("\x80\x80\x80\x80\x80\x01\x00", 7));
  ASSERT_FALSE(six.ok());
  EXPECT_NE(six.status().message().find("tag longer than 5 bytes"), std::string::npos);
  EXPECT_FALSE(DecodePlan(std::string("\x00", 1)).ok());      // field number 0
  EXPECT_FALSE(DecodePlan(std::string("\x0e\x00", 2)).ok());  // wire type 6
}

TEST(PlanDecoderTest, OneofMembersReplaceEachOtherAndMessagesMerge) {
  // One argument: int_value 4, then int_list [1], then int_list [2] again: a merged [1, 2].
  kiln::v1::Argument first, second, third;
  first.set_int_value(4);
  second.mutable_int_list()->add_values(1);
  third.mutable_int_list()->add_values(2);
  const std::string arg =
      first.SerializeAsString() + second.SerializeAsString() + third.SerializeAsString();
  // The step: a kernel first, then a library call: the library call wins.
  kiln::v1::PlanStep kernel_step;
  kernel_step.mutable_kernel()->set_symbol("k");
  kiln::v1::PlanStep library_step;
  library_step.mutable_library()->set_op("aten::sum");
  std::string library = library_step.library().SerializeAsString();
  library += std::string("\x12", 1) + static_cast<char>(arg.size()) + arg;  // LibraryCall.args
  const std::string step = kernel_step.SerializeAsString() + std::string("\x12", 1) +
                           static_cast<char>(library.size()) + library;
  const std::string plan = std::string("\x22", 1) + static_cast<char>(step.size()) + step;
  ExpectAgrees(plan, "oneof plan");
  StatusOr<PlanSpec> spec = DecodePlan(plan);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& l = std::get<LibraryStepSpec>(spec->steps.at(0));
  ASSERT_EQ(l.args.size(), 1u);
  EXPECT_EQ(l.args[0].kind, CallArg::Kind::kInts);
  EXPECT_EQ(l.args[0].i, 0);  // the int_value's payload went with it
  EXPECT_EQ(l.args[0].list, (std::vector<int64_t>{1, 2}));
}

TEST(PlanDecoderTest, AStorageOffsetExpressionGivenTwiceMergesAsProtobufMergesIt) {
  // TensorMeta.storage_offset_expr (a singular message) twice: protobuf merges the two, their
  // terms concatenated; DecodePlan kept two expressions (found by fuzz_plan_decoder).
  kiln::v1::TensorMeta first, second;
  auto* a = first.mutable_storage_offset_expr()->add_terms();
  a->set_coefficient(3);
  a->add_symbols(0);
  second.mutable_storage_offset_expr()->add_terms()->set_coefficient(5);
  const std::string meta = first.SerializeAsString() + second.SerializeAsString();
  kiln::v1::Value value;
  value.set_id(4);
  const std::string v = value.SerializeAsString() + std::string("\x12", 1) +
                        static_cast<char>(meta.size()) + meta;  // Value.meta
  const std::string plan = std::string("\x32", 1) + static_cast<char>(v.size()) + v;  // values
  ExpectAgrees(plan, "storage offset expression twice");
  StatusOr<PlanSpec> spec = DecodePlan(plan);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_EQ(spec->values.size(), 1u);
  const auto& exprs = spec->values[0].meta.storage_offset_expr;
  ASSERT_EQ(exprs.size(), 1u);
  ASSERT_EQ(exprs[0].terms.size(), 2u);
  EXPECT_EQ(exprs[0].terms[0].coefficient, 3);
  EXPECT_EQ(exprs[0].terms[1].coefficient, 5);
}

TEST(PlanDecoderTest, ErrorsNameTheFieldAndTheByte) {
  const std::string bytes = RichPlan().SerializeAsString();
  StatusOr<PlanSpec> cut = DecodePlan(bytes.substr(0, bytes.size() - 1));
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(cut.status().IsInvalidArgument());
  EXPECT_NE(cut.status().message().find("kiln plan: the ExecutionPlan does not decode: "),
            std::string::npos)
      << cut.status().message();
  EXPECT_NE(cut.status().message().find("at byte"), std::string::npos);

  // steps[0] holding a library call whose second argument's int_list is cut short.
  kiln::v1::ExecutionPlan p;
  auto* call = p.add_steps()->mutable_library();
  call->add_args()->set_value(1);
  call->add_args()->mutable_int_list()->add_values(1LL << 40);
  std::string deep = p.SerializeAsString();
  deep.back() = static_cast<char>(deep.back() | 0x80);  // the last varint now runs on
  StatusOr<PlanSpec> bad = DecodePlan(deep);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("steps[0].library.args[1].int_list: at byte"),
            std::string::npos)
      << bad.status().message();

  StatusOr<PlanSpec> kindless = DecodePlan(std::string("\x22\x02\x1a\x00", 4));  // release only
  ASSERT_FALSE(kindless.ok());
  EXPECT_NE(kindless.status().message().find("neither a kernel nor a library call"),
            std::string::npos)
      << kindless.status().message();

  StatusOr<PlanSpec> stray_end = DecodePlan(std::string("\x0c", 1));  // end of group 1
  ASSERT_FALSE(stray_end.ok());
  StatusOr<PlanSpec> long_varint =
      DecodePlan(std::string("\x40") + std::string(10, '\xff') + "\x01");
  ASSERT_FALSE(long_varint.ok());
  EXPECT_NE(long_varint.status().message().find("longer than 10 bytes"), std::string::npos);
  StatusOr<PlanSpec> huge_length = DecodePlan(std::string("\x32\xff\xff\xff\xff\x0f", 6));
  ASSERT_FALSE(huge_length.ok());
  EXPECT_NE(huge_length.status().message().find("past the end"), std::string::npos);
}

}  // namespace
}  // namespace kiln::runtime
