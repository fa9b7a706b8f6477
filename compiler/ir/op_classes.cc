// The op classes. Pointwise membership comes from the expression table so that the two can never
// disagree; views are listed by name because their aliasing, not their math, is what matters.
#include "compiler/ir/op_classes.h"

#include <string>
#include <unordered_set>

#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {
namespace {

const std::unordered_set<std::string_view>& AlwaysViews() {
  static const auto* views = new std::unordered_set<std::string_view>{
      "aten::view",        "aten::_unsafe_view", "aten::permute",          "aten::transpose.int",
      "aten::t",           "aten::expand",       "aten::unsqueeze",        "aten::squeeze",
      "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int",       "aten::slice.Tensor",
      "aten::alias",       "aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int",
      "aten::chunk",       "aten::narrow",       "aten::as_strided",       "aten::detach",
      "aten::view_as",     "aten::expand_as",    "aten::unfold",           "aten::diagonal",
      "aten::movedim.int"};
  return *views;
}

// Views when the input's layout allows, copies otherwise.
const std::unordered_set<std::string_view>& MaybeViews() {
  static const auto* views = new std::unordered_set<std::string_view>{
      "aten::reshape", "aten::contiguous", "aten::flatten.using_ints"};
  return *views;
}

}  // namespace

OpClass ClassifyOp(std::string_view op) {
  if (FindPointwise(std::string(op)) != nullptr) return OpClass::kPointwise;
  if (MayAliasInput(op)) return OpClass::kView;
  return OpClass::kLibrary;
}

bool MayAliasInput(std::string_view op) {
  return AlwaysViews().count(op) != 0 || MaybeViews().count(op) != 0;
}

bool IsAlwaysView(std::string_view op) { return AlwaysViews().count(op) != 0; }

bool IsReshapeLike(std::string_view op) {
  return op == "aten::view" || op == "aten::_unsafe_view" || op == "aten::reshape";
}

bool WritesFirstInput(std::string_view op) {
  return op == "mkldnn::_convolution_pointwise_.binary";
}

bool IsNondeterministic(std::string_view op) {
  for (std::string_view word : {"rand", "dropout", "bernoulli", "normal", "uniform", "empty",
                                "multinomial", "poisson", "exponential"}) {
    if (op.find(word) != std::string_view::npos) return true;
  }
  return false;
}

NondeterministicOps::NondeterministicOps(const kiln::v1::Graph& graph) {
  for (const kiln::v1::OpSchema& schema : graph.schemas()) {
    for (const std::string& tag : schema.tags()) {
      if (tag == "nondeterministic_seeded") declared_.insert(schema.op());
    }
  }
}

bool NondeterministicOps::Contains(std::string_view op) const {
  return IsNondeterministic(op) || declared_.count(std::string(op)) != 0;
}

bool IsForwardConvolution(const kiln::v1::Node& n) {
  using kiln::v1::Argument;
  if (n.op() != "aten::convolution" || n.args_size() != 9 || n.outputs_size() != 1) return false;
  for (const Argument& a : n.args()) {
    if (!a.name().empty()) return false;
  }
  return n.args(0).kind_case() == Argument::kValue && n.args(1).kind_case() == Argument::kValue &&
         n.args(6).kind_case() == Argument::kBoolValue && !n.args(6).bool_value() &&
         n.args(8).kind_case() == Argument::kIntValue;
}

std::vector<uint32_t> ValuesRead(const kiln::v1::Node& node) {
  std::vector<uint32_t> ids;
  for (const kiln::v1::Argument& a : node.args()) {
    if (a.kind_case() == kiln::v1::Argument::kValue) ids.push_back(a.value());
    if (a.kind_case() == kiln::v1::Argument::kValueList) {
      ids.insert(ids.end(), a.value_list().ids().begin(), a.value_list().ids().end());
    }
  }
  return ids;
}

bool IsRowMajor(const kiln::v1::TensorMeta& meta) {
  int64_t expected = 1;
  for (int d = meta.sizes_size() - 1; d >= 0; --d) {
    if (meta.sizes(d) != 1 && meta.strides(d) != expected) return false;
    expected *= meta.sizes(d);
  }
  return true;
}

}  // namespace kiln::compiler
