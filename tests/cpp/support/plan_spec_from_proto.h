// A PlanSpec read through libprotobuf's own accessors (what DecodePlan must produce for the same
// bytes), and a dump of PlanSpecs for comparing them: by text, so that a mismatch reads as a diff
// and doubles compare by their bits (NaN included). For the decoder's test and fuzz target.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/v1/artifact.pb.h"
#include "runtime/plan_spec.h"

namespace kiln::testing {

using runtime::CallArg;
using runtime::KernelStepSpec;
using runtime::LibraryStepSpec;
using runtime::MetaSpec;
using runtime::PlanSpec;
using runtime::StepSpec;
using runtime::ValueSpec;
using runtime::WireDeviceKind;
using runtime::WireDType;

inline runtime::SymExprSpec FromProto(const kiln::v1::SymExpr& e) {
  runtime::SymExprSpec out;
  for (const auto& t : e.terms()) {
    out.terms.push_back({t.coefficient(), {t.symbols().begin(), t.symbols().end()}});
  }
  return out;
}

template <typename Repeated>
std::vector<runtime::SymExprSpec> FromProtoList(const Repeated& exprs) {
  std::vector<runtime::SymExprSpec> out;
  for (const auto& e : exprs) out.push_back(FromProto(e));
  return out;
}

inline MetaSpec FromProto(const kiln::v1::TensorMeta& m) {
  MetaSpec out;
  out.dtype = static_cast<WireDType>(m.dtype());
  out.sizes.assign(m.sizes().begin(), m.sizes().end());
  out.strides.assign(m.strides().begin(), m.strides().end());
  out.storage_offset = m.storage_offset();
  out.size_exprs = FromProtoList(m.size_exprs());
  out.stride_exprs = FromProtoList(m.stride_exprs());
  if (m.has_storage_offset_expr()) out.storage_offset_expr.push_back(FromProto(m.storage_offset_expr()));
  return out;
}

inline ValueSpec FromProto(const kiln::v1::Value& v) { return {v.id(), FromProto(v.meta())}; }

inline CallArg FromProto(const kiln::v1::Argument& a) {
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
    case kiln::v1::Argument::kSymIntValue:
      out.kind = K::kSymInt, out.exprs = {FromProto(a.sym_int_value())};
      break;
    case kiln::v1::Argument::kSymIntList:
      out.kind = K::kSymInts, out.exprs = FromProtoList(a.sym_int_list().values());
      break;
    case kiln::v1::Argument::KIND_NOT_SET:
      break;
  }
  return out;
}

// Null for a step without a kind, which DecodePlan refuses.
inline std::optional<StepSpec> FromProto(const kiln::v1::PlanStep& s) {
  std::vector<uint32_t> release(s.release().begin(), s.release().end());
  if (s.has_kernel()) {
    const auto& k = s.kernel();
    return KernelStepSpec{k.symbol(),
                          {k.args().begin(), k.args().end()},
                          {k.writes().begin(), k.writes().end()},
                          release,
                          {k.grid().begin(), k.grid().end()},
                          {k.block().begin(), k.block().end()},
                          k.shared_memory_bytes(),
                          FromProtoList(k.size_args()),
                          k.has_grid_work(),
                          FromProto(k.grid_work()),
                          k.grid_work_per_block(),
                          k.grid_max()};
  }
  if (s.has_library()) {
    const auto& l = s.library();
    LibraryStepSpec out{l.op(), {}, {l.outputs().begin(), l.outputs().end()}, release, l.schema()};
    for (const auto& a : l.args()) out.args.push_back(FromProto(a));
    return out;
  }
  return std::nullopt;
}

inline std::optional<PlanSpec> FromProto(const kiln::v1::ExecutionPlan& p) {
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
  for (const auto& u : p.input_updates()) {
    out.input_updates.push_back({u.input(), u.value(), u.has_new_meta(),
                                 u.has_new_meta() ? FromProto(u.new_meta()) : MetaSpec{}});
  }
  for (const auto& y : p.size_symbols()) {
    out.size_symbols.push_back({y.id(), y.input(), y.dim(), y.min(), y.max()});
  }
  return out;
}

template <typename T>
std::string List(const std::vector<T>& v) {
  std::string out = "[";
  for (const T& x : v) out += std::to_string(x) + ",";
  return out + "]";
}

inline std::string Dump(const runtime::SymExprSpec& e) {
  std::string out = "(";
  for (const auto& t : e.terms) out += std::to_string(t.coefficient) + "*" + List(t.symbols) + "+";
  return out + ")";
}

inline std::string Dump(const std::vector<runtime::SymExprSpec>& exprs) {
  std::string out = "{";
  for (const auto& e : exprs) out += Dump(e) + ",";
  return out + "}";
}

inline std::string Dump(const MetaSpec& m) {
  return "dtype " + std::to_string(static_cast<int>(m.dtype)) + " sizes " + List(m.sizes) +
         " strides " + List(m.strides) + " offset " + std::to_string(m.storage_offset) +
         " size_exprs " + Dump(m.size_exprs) + " stride_exprs " + Dump(m.stride_exprs) +
         " storage_offset_expr " + Dump(m.storage_offset_expr);
}

inline std::string Dump(const StepSpec& step) {
  if (const auto* k = std::get_if<KernelStepSpec>(&step)) {
    return "kernel " + k->symbol + " args " + List(k->args) + " writes " + List(k->writes) +
           " release " + List(k->release) + " grid " + List(k->grid) + " block " + List(k->block) +
           " smem " + std::to_string(k->shared_memory_bytes) + " size_args " +
           Dump(k->size_args) + " grid_work " + std::to_string(k->has_grid_work) +
           Dump(k->grid_work) + "/" + std::to_string(k->grid_work_per_block) + "<=" +
           std::to_string(k->grid_max) + "\n";
  }
  const auto& l = std::get<LibraryStepSpec>(step);
  std::string out = "library " + l.op + " outputs " + List(l.outputs) + " release " +
                    List(l.release) + " schema '" + l.schema + "'\n";
  for (const CallArg& a : l.args) {
    out += "  arg '" + a.name + "' kind " + std::to_string(static_cast<int>(a.kind)) + " i " +
           std::to_string(a.i) + " f " + std::to_string(std::bit_cast<uint64_t>(a.f)) + " b " +
           std::to_string(a.b) + " list " + List(a.list) + " s '" + a.s + "' device " +
           std::to_string(static_cast<int>(a.device.kind)) + ":" + std::to_string(a.device.index) +
           " exprs " + Dump(a.exprs) + "\n";
  }
  return out;
}

inline std::string Dump(const PlanSpec& p) {
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
  for (const auto& u : p.input_updates) {
    out += "update " + std::to_string(u.input) + " <- " + std::to_string(u.value) +
           (u.has_new_meta ? " as " + Dump(u.new_meta) : std::string()) + "\n";
  }
  for (const auto& y : p.size_symbols) {
    out += "symbol " + std::to_string(y.id) + " = input " + std::to_string(y.input) + " dim " +
           std::to_string(y.dim) + " in [" + std::to_string(y.min) + ", " +
           std::to_string(y.max) + "]\n";
  }
  return out;
}

}  // namespace kiln::testing
