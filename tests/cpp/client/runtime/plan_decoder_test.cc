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
#if __has_include(<google/protobuf/stubs/logging.h>)
#include <google/protobuf/stubs/logging.h>
#define KILN_HAS_LOG_SILENCER 1
#endif

namespace kiln::runtime {
namespace {

static_assert(static_cast<int>(WireDType::kBFloat16) == kiln::v1::DTYPE_BFLOAT16);
static_assert(static_cast<int>(WireDType::kComplex128) == kiln::v1::DTYPE_COMPLEX128);
static_assert(static_cast<int>(WireDeviceKind::kCuda) == kiln::v1::DEVICE_KIND_CUDA);
static_assert(static_cast<int>(WireMemoryFormat::kChannelsLast3d) ==
              kiln::v1::MEMORY_FORMAT_CHANNELS_LAST_3D);
static_assert(static_cast<int>(WireLayout::kStrided) == kiln::v1::LAYOUT_STRIDED);

// ---- the expected PlanSpec, read through protobuf's own accessors ----

MetaSpec FromProto(const kiln::v1::TensorMeta& m) {
  MetaSpec out;
  out.dtype = static_cast<WireDType>(m.dtype());
  out.sizes.assign(m.sizes().begin(), m.sizes().end());
  out.strides.assign(m.strides().begin(), m.strides().end());
  out.storage_offset = m.storage_offset();
  return out;
}

ValueSpec FromProto(const kiln::v1::Value& v) { return {v.id(), FromProto(v.meta())}; }

CallArg FromProto(const kiln::v1::Argument& a) {
  using K = CallArg::Kind;
  CallArg out;
  out.name = a.name();
  switch (a.kind_case()) {
    case kiln::v1::Argument::kValue:
      out.kind = K::kValue, out.i = a.value();
      break;
    case kiln::v1::Argument::kIntValue:
      out.kind = K::kInt, out.i = a.int_value();
      break;
    case kiln::v1::Argument::kFloatValue:
      out.kind = K::kFloat, out.f = a.float_value();
      break;
    case kiln::v1::Argument::kBoolValue:
      out.kind = K::kBool, out.b = a.bool_value();
      break;
    case kiln::v1::Argument::kIntList:
      out.kind = K::kInts;
      out.list.assign(a.int_list().values().begin(), a.int_list().values().end());
      break;
    case kiln::v1::Argument::kValueList:
      out.kind = K::kValues;
      out.list.assign(a.value_list().ids().begin(), a.value_list().ids().end());
      break;
    case kiln::v1::Argument::kDtypeValue:
      out.kind = K::kDtype, out.i = a.dtype_value();
      break;
    case kiln::v1::Argument::kNone:
      out.kind = K::kNone;
      break;
    case kiln::v1::Argument::kStringValue:
      out.kind = K::kStr, out.s = a.string_value();
      break;
    case kiln::v1::Argument::kDeviceValue:
      out.kind = K::kDevice;
      out.device = {static_cast<WireDeviceKind>(a.device_value().kind()), a.device_value().index()};
      break;
    case kiln::v1::Argument::kMemoryFormatValue:
      out.kind = K::kMemoryFormat, out.i = a.memory_format_value();
      break;
    case kiln::v1::Argument::kLayoutValue:
      out.kind = K::kLayout, out.i = a.layout_value();
      break;
    case kiln::v1::Argument::KIND_NOT_SET:
      break;
  }
  return out;
}

// Null for a step without a kind, which DecodePlan refuses.
std::optional<StepSpec> FromProto(const kiln::v1::PlanStep& s) {
  std::vector<uint32_t> release(s.release().begin(), s.release().end());
  if (s.has_kernel()) {
    const auto& k = s.kernel();
    return KernelStepSpec{k.symbol(),
                          {k.args().begin(), k.args().end()},
                          {k.writes().begin(), k.writes().end()},
                          release};
  }
  if (s.has_library()) {
    const auto& l = s.library();
    LibraryStepSpec out{l.op(), {}, {l.outputs().begin(), l.outputs().end()}, release};
    for (const auto& a : l.args()) out.args.push_back(FromProto(a));
    return out;
  }
  return std::nullopt;
}

std::optional<PlanSpec> FromProto(const kiln::v1::ExecutionPlan& p) {
  PlanSpec out;
  out.inputs.assign(p.inputs().begin(), p.inputs().end());
  for (const auto& c : p.constants()) out.constants.push_back({FromProto(c.value()), c.data()});
  for (const auto& list : {&p.steps(), &p.prologue()}) {
    auto& into = list == &p.steps() ? out.steps : out.prologue;
    for (const auto& s : *list) {
      std::optional<StepSpec> step = FromProto(s);
      if (!step) return std::nullopt;
      into.push_back(std::move(*step));
    }
  }
  out.outputs.assign(p.outputs().begin(), p.outputs().end());
  for (const auto& v : p.values()) out.values.push_back(FromProto(v));
  for (const auto& b : p.buffers()) out.buffers.push_back({b.id(), b.in_arena(), b.arena_offset()});
  out.arena_bytes = p.arena_bytes();
  out.prologue_outputs.assign(p.prologue_outputs().begin(), p.prologue_outputs().end());
  return out;
}

// ---- comparison through a dump: readable diffs, and doubles compared by their bits ----

template <typename T>
std::string List(const std::vector<T>& v) {
  std::string out = "[";
  for (const T& x : v) out += std::to_string(x) + ",";
  return out + "]";
}

std::string Dump(const MetaSpec& m) {
  return "dtype " + std::to_string(static_cast<int>(m.dtype)) + " sizes " + List(m.sizes) +
         " strides " + List(m.strides) + " offset " + std::to_string(m.storage_offset);
}

std::string Dump(const StepSpec& step) {
  if (const auto* k = std::get_if<KernelStepSpec>(&step)) {
    return "kernel " + k->symbol + " args " + List(k->args) + " writes " + List(k->writes) +
           " release " + List(k->release) + "\n";
  }
  const auto& l = std::get<LibraryStepSpec>(step);
  std::string out =
      "library " + l.op + " outputs " + List(l.outputs) + " release " + List(l.release) + "\n";
  for (const CallArg& a : l.args) {
    out += "  arg '" + a.name + "' kind " + std::to_string(static_cast<int>(a.kind)) + " i " +
           std::to_string(a.i) + " f " + std::to_string(std::bit_cast<uint64_t>(a.f)) + " b " +
           std::to_string(a.b) + " list " + List(a.list) + " s '" + a.s + "' device " +
           std::to_string(static_cast<int>(a.device.kind)) + ":" + std::to_string(a.device.index) +
           "\n";
  }
  return out;
}

std::string Dump(const PlanSpec& p) {
  std::string out = "inputs " + List(p.inputs) + "\noutputs " + List(p.outputs) + "\narena " +
                    std::to_string(p.arena_bytes) + "\nprologue_outputs " +
                    List(p.prologue_outputs) + "\n";
  for (const auto& v : p.values) out += "value " + std::to_string(v.id) + " " + Dump(v.meta) + "\n";
  for (const auto& c : p.constants) {
    out += "constant " + std::to_string(c.value.id) + " " + Dump(c.value.meta) + " data " +
           std::to_string(std::hash<std::string_view>{}(c.data)) + "/" +
           std::to_string(c.data.size()) + "\n";
  }
  for (const auto& b : p.buffers) {
    out += "buffer " + std::to_string(b.id) + " " + std::to_string(b.in_arena) + " " +
           std::to_string(b.arena_offset) + "\n";
  }
  for (const auto& s : p.prologue) out += "prologue " + Dump(s);
  for (const auto& s : p.steps) out += "step " + Dump(s);
  return out;
}

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
  k->mutable_kernel()->add_grid(1);  // skipped: CUDA only
  k->mutable_kernel()->set_shared_memory_bytes(16);
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
  l->add_release(3);

  auto* b = p.add_buffers();
  b->set_id(3);
  b->set_in_arena(true);
  b->set_arena_offset(128);
  p.set_arena_bytes(1ULL << 33);
  for (uint32_t id : {5u, 0u, 5u}) p.add_outputs(id);
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
