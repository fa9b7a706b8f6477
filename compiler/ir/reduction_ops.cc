// The reduction table and the checks that decide whether a reduction node is generated.
#include "compiler/ir/reduction_ops.h"

#include <algorithm>
#include <string>

#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;

struct ReductionOp {
  const char* name;
  ReductionKind kind;
  std::vector<std::string> formals;
};

const std::vector<ReductionOp>& Table() {
  static const auto* table = new std::vector<ReductionOp>{
      {"aten::sum.dim_IntList", ReductionKind::kSum, {"self", "dim", "keepdim", "dtype"}},
      {"aten::mean.dim", ReductionKind::kMean, {"self", "dim", "keepdim", "dtype"}},
      {"aten::sum", ReductionKind::kSum, {"self", "dtype"}},
      {"aten::mean", ReductionKind::kMean, {"self", "dtype"}},
      {"aten::amax", ReductionKind::kAmax, {"self", "dim", "keepdim"}},
      {"aten::amin", ReductionKind::kAmin, {"self", "dim", "keepdim"}},
      {"aten::var.correction", ReductionKind::kVar, {"self", "dim", "correction", "keepdim"}},
      {"aten::std.correction", ReductionKind::kStd, {"self", "dim", "correction", "keepdim"}},
      {"aten::var_mean.correction",
       ReductionKind::kVarMean,
       {"self", "dim", "correction", "keepdim"}},
  };
  return *table;
}

bool Absent(const Argument* a) { return a == nullptr || a->kind_case() == Argument::kNone; }

}  // namespace

bool IsReductionOp(const std::string& op) {
  const auto& table = Table();
  return std::any_of(table.begin(), table.end(),
                     [&](const ReductionOp& r) { return op == r.name; });
}

std::optional<Reduction> MatchReduction(
    const kiln::v1::Node& node,
    const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
    kiln::v1::DeviceKind device) {
  const auto& table = Table();
  auto op = std::find_if(table.begin(), table.end(),
                         [&](const ReductionOp& r) { return node.op() == r.name; });
  if (op == table.end()) return std::nullopt;
  const int expected_outputs = op->kind == ReductionKind::kVarMean ? 2 : 1;
  if (node.outputs_size() != expected_outputs) return std::nullopt;
  auto bound = BindArguments(node, op->formals);
  if (!bound) return std::nullopt;
  const Argument* self = (*bound)[0];
  if (self == nullptr || self->kind_case() != Argument::kValue) return std::nullopt;
  auto in = meta.find(self->value());
  if (in == meta.end()) return std::nullopt;
  const kiln::v1::TensorMeta& m = *in->second;
  if (!IsFloatingDType(m.dtype()) || m.device().kind() != device) return std::nullopt;
  for (const auto& out : node.outputs()) {
    if (out.meta().dtype() != m.dtype() || out.meta().device().kind() != device) {
      return std::nullopt;
    }
  }
  Reduction r{op->kind, self->value()};
  const int rank = m.sizes_size();
  // dim: an int list (negative counts from the end); absent or empty reduces every dim.
  std::vector<int> dims;
  const auto dim_formal = std::find(op->formals.begin(), op->formals.end(), "dim");
  const Argument* dim =
      dim_formal == op->formals.end() ? nullptr : (*bound)[dim_formal - op->formals.begin()];
  if (!Absent(dim)) {
    if (dim->kind_case() != Argument::kIntList) return std::nullopt;
    for (int64_t d : dim->int_list().values()) {
      if (d < -rank || d >= rank) return std::nullopt;
      dims.push_back(static_cast<int>(d < 0 ? d + rank : d));
    }
  }
  if (dims.empty()) {
    for (int d = 0; d < rank; ++d) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  if (std::adjacent_find(dims.begin(), dims.end()) != dims.end()) return std::nullopt;
  r.outer_rank = rank - static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != r.outer_rank + static_cast<int>(i)) return std::nullopt;  // not trailing
  }
  int64_t inner = 1, outer = 1;
  for (int d = 0; d < rank; ++d) (d < r.outer_rank ? outer : inner) *= m.sizes(d);
  if (inner < 2 || outer < 1) return std::nullopt;
  for (size_t i = 1; i < op->formals.size(); ++i) {
    const Argument* a = (*bound)[i];
    const std::string& formal = op->formals[i];
    if (formal == "keepdim") {
      if (Absent(a)) continue;
      if (a->kind_case() != Argument::kBoolValue) return std::nullopt;
      r.keepdim = a->bool_value();
    } else if (formal == "dtype") {
      if (!Absent(a)) return std::nullopt;
    } else if (formal == "correction") {
      if (Absent(a)) continue;
      if (a->kind_case() != Argument::kIntValue && a->kind_case() != Argument::kFloatValue) {
        return std::nullopt;
      }
      r.correction = ScalarValue(*a);
    }
  }
  return r;
}

bool DimsFromEnd(kiln::v1::Node& node, int rank) {
  const auto& table = Table();
  auto op = std::find_if(table.begin(), table.end(),
                         [&](const ReductionOp& r) { return node.op() == r.name; });
  if (op == table.end()) return false;
  auto dim_formal = std::find(op->formals.begin(), op->formals.end(), "dim");
  if (dim_formal == op->formals.end()) return false;
  auto bound = BindArguments(node, op->formals);
  if (!bound) return false;
  const Argument* dim = (*bound)[dim_formal - op->formals.begin()];
  if (Absent(dim) || dim->kind_case() != Argument::kIntList) return false;
  for (Argument& a : *node.mutable_args()) {
    if (&a != dim) continue;
    for (int64_t& d : *a.mutable_int_list()->mutable_values()) {
      if (d >= 0) d -= rank;
    }
    return true;
  }
  return false;
}

}  // namespace kiln::compiler
