// AdmitOp: the allowlist first, then the rule over the declared schema, then the denylist.
#include "compiler/ir/op_admission.h"

#include <regex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compiler/ir/op_schema.h"

namespace kiln::compiler {
namespace {

// Ops that are pure by their schemas but not in fact, each with why: by name (every overload) or
// by name and overload.
constexpr std::pair<const char*, const char*> kDenied[] = {
    // The host reads a device value (a synchronisation; on CUDA it also breaks graph capture)
    // or the result's size depends on the values.
    {"aten::_local_scalar_dense", "reads a device value on the host"},
    {"aten::item", "reads a device value on the host"},
    {"aten::is_nonzero", "reads a device value on the host"},
    {"aten::equal", "reads a device value on the host"},
    {"aten::allclose", "reads a device value on the host"},
    {"aten::nonzero", "sizes its result by the values (a host synchronisation)"},
    {"aten::nonzero_numpy", "sizes its result by the values (a host synchronisation)"},
    {"aten::argwhere", "sizes its result by the values (a host synchronisation)"},
    {"aten::masked_select", "sizes its result by the values (a host synchronisation)"},
    {"aten::masked_scatter", "reads a device value on the host"},
    {"aten::unique_consecutive", "sizes its result by the values (a host synchronisation)"},
    {"aten::unique_dim", "sizes its result by the values (a host synchronisation)"},
    {"aten::unique_dim_consecutive", "sizes its result by the values (a host synchronisation)"},
    {"aten::_unique", "sizes its result by the values (a host synchronisation)"},
    {"aten::_unique2", "sizes its result by the values (a host synchronisation)"},
    {"aten::bincount", "sizes its result by the values (a host synchronisation)"},
    {"aten::histc", "reads a device value on the host"},
    {"aten::repeat_interleave.Tensor", "sizes its result by the values (a host synchronisation)"},
    // Assertions and effect tokens: their point is an effect.
    {"aten::_assert_async", "raises from the device"},
    {"aten::_assert_scalar", "raises on a value"},
    {"aten::_assert_tensor_metadata", "raises on metadata"},
    {"aten::_functional_assert_async", "raises from the device"},
    {"aten::_functional_assert_scalar", "raises on a value"},
    {"aten::_functional_sym_constrain_range", "constrains a value"},
    {"aten::_functional_sym_constrain_range_for_size", "constrains a value"},
    {"aten::sym_constrain_range", "constrains a value"},
    {"aten::sym_constrain_range_for_size", "constrains a value"},
    {"aten::_make_dep_token", "makes an effect token"},
    // I/O and process state.
    {"aten::from_file", "reads a file"},
    {"aten::_cudnn_init_dropout_state", "makes cuDNN's dropout state from a seed"},
    {"aten::_cufft_set_plan_cache_max_size", "changes cuFFT's plan cache"},
    {"aten::_cufft_clear_plan_cache", "changes cuFFT's plan cache"},
    {"aten::_print", "prints"},
    // Writes what its schema does not say it writes (dst).
    {"aten::_copy_from", "writes an argument its schema does not mark"},
    {"aten::_copy_from_and_resize", "writes an argument its schema does not mark"},
};

// Prefixes of names whose ops are tests or internal plumbing, not computations.
constexpr std::pair<const char*, const char*> kDeniedPrefixes[] = {
    {"aten::_test_", "is one of torch's test ops"},
    {"aten::_cufft_", "changes cuFFT's plan cache"},
    {"aten::_nested_", "takes or makes nested tensors, which kiln.v1 has not"},
    {"aten::_sparse_", "takes or makes sparse tensors, which kiln.v1 has not"},
};

// Tags whose ops the rule refuses.
constexpr std::pair<const char*, const char*> kDeniedTags[] = {
    {"dynamic_output_shape", "sizes its result by the values (a host synchronisation)"},
    {"data_dependent_output", "reads a device value on the host"},
    {"inplace_view", "changes its argument's metadata"},
};

// The argument types a kiln.v1 Argument can carry (a list of each too). A Generator only as
// None: the op then draws from the default generator, as eager does.
bool CarriedType(std::string type) {
  bool optional = false;
  while (true) {
    if (!type.empty() && type.back() == '?') {
      type.pop_back();
      optional = true;
    } else if (!type.empty() && type.back() == ']') {
      const size_t open = type.rfind('[');
      if (open == std::string::npos) return false;
      type.erase(open);
    } else {
      break;
    }
  }
  if (type == "Generator") return optional;
  for (const char* carried : {"Tensor", "int", "SymInt", "float", "SymFloat", "bool", "SymBool",
                              "str", "Scalar", "ScalarType", "Layout", "Device", "MemoryFormat"}) {
    if (type == carried) return true;
  }
  return false;
}

std::string BaseName(std::string_view op) {
  const size_t colons = op.find("::");
  const size_t dot = op.find('.', colons == std::string_view::npos ? 0 : colons + 2);
  return std::string(op.substr(0, dot));
}

}  // namespace

std::string_view DeniedBecause(std::string_view op) {
  const std::string base = BaseName(op);
  for (const auto& [name, why] : kDenied) {
    if (base == name || op == name) return why;
  }
  for (const auto& [prefix, why] : kDeniedPrefixes) {
    if (base.rfind(prefix, 0) == 0) return why;
  }
  return {};
}

absl::Status AdmitOp(const kiln::v1::Node& node, const OpAllowlist& allowlist,
                     const kiln::v1::OpSchema* declared) {
  const std::string& op = node.op();
  if (allowlist.Contains(op)) return absl::OkStatus();
  auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op '", op.substr(0, 128), "' is not on the allowlist and ", std::string(why)));
  };
  static const std::regex kAtenName("aten::[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z0-9_]+)?");
  if (!std::regex_match(op, kAtenName)) {
    return refuse("is not an aten op (only aten ops are admitted by their schema)");
  }
  if (std::string_view why = DeniedBecause(op); !why.empty()) {
    return refuse(absl::StrCat("is denied: it ", std::string(why)));
  }
  if (declared == nullptr) return refuse("the graph declares no schema for it");
  // The validator parsed every declared schema and checked its name before any node.
  const std::optional<OpSchemaText> schema = ParseOpSchema(declared->schema());
  if (!schema) return refuse("its declared schema does not parse");
  for (const std::string& tag : declared->tags()) {
    for (const auto& [denied, why] : kDeniedTags) {
      if (tag == denied) return refuse(absl::StrCat("is tagged ", tag, ": it ", why));
    }
  }
  for (const SchemaSlot& a : schema->arguments) {
    if (a.written) return refuse(absl::StrCat("writes its argument '", a.name, "'"));
    if (a.aliased) return refuse(absl::StrCat("returns a view of its argument '", a.name, "'"));
    if (!CarriedType(a.type)) {
      return refuse(absl::StrCat("takes '", a.name, "' of type ", a.type,
                                 ", which a kiln.v1 argument cannot carry"));
    }
  }
  int tensors = 0;
  bool list = false;
  for (const SchemaSlot& r : schema->returns) {
    if (r.aliased) return refuse("returns a view of an argument");
    switch (ClassifyResult(r.type)) {
      case ResultKind::kTensor:
        ++tensors;
        break;
      case ResultKind::kTensorList:
        list = true;
        break;
      case ResultKind::kNumber:
        break;
      case ResultKind::kOther:
        return refuse(absl::StrCat("returns a ", r.type, ", which a plan cannot bind"));
    }
  }
  if (tensors == 0 && !list) return refuse("returns no tensor");
  if (!list && node.outputs_size() != tensors) {
    return refuse(
        absl::StrCat("returns ", tensors, " tensors, the node defines ", node.outputs_size()));
  }
  return absl::OkStatus();
}

}  // namespace kiln::compiler
