// ValidateRequest: structural checks of the graph IR, the target and the options.
#include "compiler/ir/ir_validator.h"

#include <regex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "compiler/ir/op_admission.h"
#include "compiler/ir/op_schema.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;
using kiln::v1::TensorMeta;
using kiln::v1::Value;

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

bool ValidDeviceKind(kiln::v1::DeviceKind kind) {
  return kind == kiln::v1::DEVICE_KIND_CPU || kind == kiln::v1::DEVICE_KIND_CUDA;
}

// The graph's size symbols (empty for a static graph).
using Symbols = std::unordered_set<uint32_t>;

// Size and stride expressions of `meta`: one per dim, canonical over `symbols`, and the static
// sizes / strides saying -1 / 0 exactly where the expression is not a constant; a storage offset
// expression canonical and not a constant, the static offset 0 beside it.
absl::Status ValidateMetaExprs(const TensorMeta& meta, const Symbols& symbols) {
  if (meta.size_exprs_size() == 0 && meta.stride_exprs_size() == 0 &&
      !meta.has_storage_offset_expr()) {
    return absl::OkStatus();
  }
  if (symbols.empty()) return Invalid("size expressions in a graph without size symbols");
  if (meta.has_storage_offset_expr()) {
    if (std::string problem = SymExprProblem(meta.storage_offset_expr(), symbols);
        !problem.empty()) {
      return Invalid("storage offset expression: " + problem);
    }
    if (ConstantOf(meta.storage_offset_expr())) {
      return Invalid("a constant storage offset written as an expression");
    }
    if (meta.storage_offset() != 0) {
      return Invalid("storage offset " + std::to_string(meta.storage_offset()) +
                     " disagrees with its expression");
    }
  }
  if (meta.size_exprs_size() != meta.sizes_size() ||
      meta.stride_exprs_size() != meta.sizes_size()) {
    return Invalid("size and stride expressions are not one per dimension");
  }
  for (int d = 0; d < meta.sizes_size(); ++d) {
    for (const bool size : {true, false}) {
      const kiln::v1::SymExpr& e = size ? meta.size_exprs(d) : meta.stride_exprs(d);
      const char* what = size ? "size" : "stride";
      if (std::string problem = SymExprProblem(e, symbols); !problem.empty()) {
        return Invalid(absl::StrCat(what, " expression of dimension ", d, ": ", problem));
      }
      const int64_t stated = size ? meta.sizes(d) : meta.strides(d);
      const std::optional<int64_t> constant = ConstantOf(e);
      if (constant ? *constant != stated : stated != (size ? -1 : 0)) {
        return Invalid(absl::StrCat(what, " ", stated, " of dimension ", d,
                                    " disagrees with its expression"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMeta(const TensorMeta& meta, const ValidationLimits& limits, int64_t* numel,
                          const Symbols& symbols = {}) {
  if (ElementSize(meta.dtype()) == 0) return Invalid("tensor has no valid dtype");
  if (meta.sizes_size() > limits.max_rank) {
    return Invalid(absl::StrCat("tensor rank ", meta.sizes_size(), " exceeds ", limits.max_rank));
  }
  if (meta.strides_size() != meta.sizes_size()) {
    return Invalid("tensor strides and sizes differ in length");
  }
  if (absl::Status s = ValidateMetaExprs(meta, symbols); !s.ok()) return s;
  // A symbolic dimension's size is checked per call by the runtime; the limit below bounds the
  // static ones.
  // The limit bounds the product of the nonzero sizes, not just numel: an empty tensor such as
  // [0, 2^62, 2^62] would otherwise pass, and every product of its sizes (IsContiguous, the
  // contiguous strides a compiler computes) would overflow int64.
  int64_t n = 1;
  bool empty = false;
  for (int i = 0; i < meta.sizes_size(); ++i) {
    int64_t size = meta.sizes(i);
    if (IsSymbolic(meta) && !ConstantOf(meta.size_exprs(i))) continue;
    if (size < 0) return Invalid("tensor size is negative");
    if (meta.strides(i) < 0) return Invalid("tensor stride is negative");
    if (size == 0) {
      empty = true;
      continue;
    }
    if (n > limits.max_numel / size) return Invalid("tensor has too many elements");
    n *= size;
  }
  if (n > limits.max_numel) return Invalid("tensor has too many elements");
  if (empty) n = 0;
  if (meta.storage_offset() < 0) return Invalid("tensor storage offset is negative");
  if (!ValidDeviceKind(meta.device().kind())) return Invalid("tensor has no valid device kind");
  if (meta.device().index() < 0) return Invalid("tensor device index is negative");
  if (meta.device().kind() == kiln::v1::DEVICE_KIND_CPU && meta.device().index() != 0) {
    return Invalid("CPU tensors have device index 0");
  }
  *numel = n;
  return absl::OkStatus();
}

bool IsContiguous(const TensorMeta& meta) {
  int64_t expected = 1;
  for (int i = meta.sizes_size() - 1; i >= 0; --i) {
    if (meta.sizes(i) != 1 && meta.strides(i) != expected) return false;
    expected *= meta.sizes(i);
  }
  return meta.storage_offset() == 0;
}

absl::Status ValidateTarget(const kiln::v1::Target& target) {
  static const std::regex kIsa("[a-z0-9_.+-]{0,32}");
  static const std::regex kArch("sm_[0-9]{2,3}[a-z]?");
  switch (target.device_kind()) {
    case kiln::v1::DEVICE_KIND_CPU:
      if (!target.cuda_arch().empty()) return Invalid("CPU target with a CUDA arch");
      if (!std::regex_match(target.cpu_isa(), kIsa)) return Invalid("malformed CPU ISA");
      return absl::OkStatus();
    case kiln::v1::DEVICE_KIND_CUDA:
      if (!target.cpu_isa().empty()) return Invalid("CUDA target with a CPU ISA");
      if (!std::regex_match(target.cuda_arch(), kArch)) return Invalid("malformed CUDA arch");
      return absl::OkStatus();
    default:
      return Invalid("target has no valid device kind");
  }
}

absl::Status ValidateOptions(const kiln::v1::CompileOptions& options,
                             const ValidationLimits& limits) {
  if (options.mode().size() > 64) return Invalid("compile mode too long");
  if (options.extra_size() > limits.max_options) return Invalid("too many compile options");
  std::set<std::string> keys;
  for (const auto& option : options.extra()) {
    if (option.key().empty() || option.key().size() > 128 || option.value().size() > 1024) {
      return Invalid("malformed compile option");
    }
    if (!keys.insert(option.key()).second) {
      return Invalid(absl::StrCat("duplicate compile option ", option.key()));
    }
  }
  return absl::OkStatus();
}

// The graph's declared schemas by op, each well-formed and named for its op.
absl::Status ValidateSchemas(const kiln::v1::Graph& graph, const ValidationLimits& limits,
                             std::unordered_map<std::string, const kiln::v1::OpSchema*>* by_op) {
  if (graph.schemas_size() > limits.max_schemas) return Invalid("graph declares too many schemas");
  for (int i = 0; i < graph.schemas_size(); ++i) {
    const kiln::v1::OpSchema& s = graph.schemas(i);
    const std::string where = absl::StrCat("schema ", i, " (", s.op().substr(0, 128), ")");
    if (s.op().empty() || s.op().size() > 128) return Invalid(where + ": malformed op name");
    if (s.schema().size() > static_cast<size_t>(limits.max_schema_chars)) {
      return Invalid(where + ": schema too long");
    }
    if (s.tags_size() > 64) return Invalid(where + ": too many tags");
    for (const std::string& tag : s.tags()) {
      if (tag.empty() || tag.size() > 64) return Invalid(where + ": malformed tag");
    }
    const std::optional<OpSchemaText> parsed = ParseOpSchema(s.schema());
    if (!parsed) return Invalid(where + ": the schema does not parse");
    if (parsed->name != s.op()) {
      return Invalid(absl::StrCat(where, ": the schema is ", parsed->name.substr(0, 128), "'s"));
    }
    if (!by_op->emplace(s.op(), &s).second) return Invalid(where + ": declared twice");
  }
  return absl::OkStatus();
}

absl::Status ValidateInputUpdates(const kiln::v1::Graph& graph, const ValidationLimits& limits,
                                  const std::unordered_map<uint32_t, const TensorMeta*>& meta) {
  std::unordered_map<uint32_t, const TensorMeta*> inputs;
  for (const Value& v : graph.inputs()) inputs[v.id()] = &v.meta();
  std::unordered_set<uint32_t> updated;
  for (int i = 0; i < graph.input_updates_size(); ++i) {
    const kiln::v1::InputUpdate& u = graph.input_updates(i);
    const std::string where = absl::StrCat("input update ", i);
    auto input = inputs.find(u.input());
    if (input == inputs.end()) {
      return Invalid(absl::StrCat(where, ": value ", u.input(), " is not a graph input"));
    }
    if (!updated.insert(u.input()).second) {
      return Invalid(absl::StrCat(where, ": input ", u.input(), " is updated twice"));
    }
    auto value = meta.find(u.value());
    if (value == meta.end()) {
      return Invalid(absl::StrCat(where, ": value ", u.value(), " is undefined"));
    }
    const TensorMeta* after = input->second;
    if (u.has_new_meta() && IsSymbolic(graph)) {
      // The update writes the input's elements per call; its metadata cannot spell a layout at
      // the call's sizes.
      return Invalid(where + ": a graph with size symbols changes an input's layout");
    }
    if (u.has_new_meta()) {
      int64_t numel = 0;
      if (absl::Status s = ValidateMeta(u.new_meta(), limits, &numel); !s.ok()) {
        return Invalid(absl::StrCat(where, ": new metadata: ", s.message()));
      }
      if (u.new_meta().dtype() != after->dtype() ||
          u.new_meta().device().kind() != after->device().kind() ||
          u.new_meta().device().index() != after->device().index()) {
        return Invalid(where + ": new metadata changes the input's dtype or device");
      }
      after = &u.new_meta();
    }
    const TensorMeta& v = *value->second;
    const bool same_sizes =
        std::equal(v.sizes().begin(), v.sizes().end(), after->sizes().begin(),
                   after->sizes().end()) &&
        std::equal(v.size_exprs().begin(), v.size_exprs().end(), after->size_exprs().begin(),
                   after->size_exprs().end(),
                   [](const kiln::v1::SymExpr& a, const kiln::v1::SymExpr& b) {
                     return SymEqual(a, b);
                   });
    if (v.dtype() != after->dtype() || !same_sizes) {
      return Invalid(absl::StrCat(where, ": value ", u.value(),
                                  " has another dtype or other sizes than its input"));
    }
  }
  return absl::OkStatus();
}

// Each size symbol bound to a per-call input's dimension whose size is exactly that symbol, with
// a range.
absl::Status ValidateSizeSymbols(const kiln::v1::Graph& graph) {
  if (!IsSymbolic(graph)) return absl::OkStatus();
  std::unordered_map<uint32_t, const TensorMeta*> per_call;
  for (int i = static_cast<int>(graph.num_bound_inputs()); i < graph.inputs_size(); ++i) {
    per_call[graph.inputs(i).id()] = &graph.inputs(i).meta();
  }
  for (const kiln::v1::SizeSymbol& symbol : graph.size_symbols()) {
    const std::string where = absl::StrCat("size symbol ", symbol.id());
    auto input = per_call.find(symbol.input());
    if (input == per_call.end()) {
      return Invalid(absl::StrCat(where, ": value ", symbol.input(), " is not a per-call input"));
    }
    const TensorMeta& meta = *input->second;
    uint32_t named = 0;
    if (symbol.dim() >= static_cast<uint32_t>(meta.size_exprs_size()) ||
        !IsSymbol(meta.size_exprs(static_cast<int>(symbol.dim())), &named) ||
        named != symbol.id()) {
      return Invalid(absl::StrCat(where, ": dimension ", symbol.dim(), " of input ",
                                  symbol.input(), " is not this symbol"));
    }
    if (symbol.min() < 0 || (symbol.max() != 0 && symbol.max() < symbol.min())) {
      return Invalid(where + ": malformed range");
    }
  }
  return absl::OkStatus();
}

}  // namespace

int ElementSize(kiln::v1::DType dtype) {
  switch (dtype) {
    case kiln::v1::DTYPE_BOOL:
    case kiln::v1::DTYPE_INT8:
    case kiln::v1::DTYPE_UINT8:
      return 1;
    case kiln::v1::DTYPE_FLOAT16:
    case kiln::v1::DTYPE_BFLOAT16:
    case kiln::v1::DTYPE_INT16:
      return 2;
    case kiln::v1::DTYPE_FLOAT32:
    case kiln::v1::DTYPE_INT32:
      return 4;
    case kiln::v1::DTYPE_FLOAT64:
    case kiln::v1::DTYPE_INT64:
    case kiln::v1::DTYPE_UINT64:
    case kiln::v1::DTYPE_COMPLEX64:
      return 8;
    case kiln::v1::DTYPE_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

absl::Status ValidateRequest(const kiln::v1::CompileRequest& request, const OpAllowlist& ops,
                             const ValidationLimits& limits) {
  if (!request.has_graph()) return Invalid("request has no graph");
  if (!request.has_target()) return Invalid("request has no target");
  if (absl::Status s = ValidateTarget(request.target()); !s.ok()) return s;
  if (absl::Status s = ValidateOptions(request.options(), limits); !s.ok()) return s;

  const kiln::v1::Graph& graph = request.graph();
  if (graph.nodes_size() > limits.max_nodes) return Invalid("graph has too many nodes");
  std::unordered_map<std::string, const kiln::v1::OpSchema*> schemas;
  if (absl::Status s = ValidateSchemas(graph, limits, &schemas); !s.ok()) return s;
  Symbols symbols;
  for (const kiln::v1::SizeSymbol& symbol : graph.size_symbols()) {
    if (symbols.size() >= static_cast<size_t>(limits.max_size_symbols)) {
      return Invalid("graph declares too many size symbols");
    }
    if (!symbols.insert(symbol.id()).second) {
      return Invalid(absl::StrCat("size symbol ", symbol.id(), " declared twice"));
    }
  }
  std::unordered_map<uint32_t, const TensorMeta*> defined;
  auto define = [&](const Value& value, std::string_view where) -> absl::Status {
    if (defined.size() >= static_cast<size_t>(limits.max_values)) {
      return Invalid("graph has too many values");
    }
    if (!defined.emplace(value.id(), &value.meta()).second) {
      return Invalid(absl::StrCat(std::string(where), ": value id ", value.id(), " defined twice"));
    }
    int64_t numel = 0;
    if (absl::Status s = ValidateMeta(value.meta(), limits, &numel, symbols); !s.ok()) {
      return Invalid(absl::StrCat(std::string(where), ": value ", value.id(), ": ", s.message()));
    }
    return absl::OkStatus();
  };
  auto valid_expr = [&](const kiln::v1::SymExpr& e, const std::string& where) -> absl::Status {
    if (symbols.empty()) return Invalid(where + ": a SymInt argument in a static graph");
    if (std::string problem = SymExprProblem(e, symbols); !problem.empty()) {
      return Invalid(absl::StrCat(where, ": SymInt argument: ", problem));
    }
    return absl::OkStatus();
  };

  for (int i = 0; i < graph.inputs_size(); ++i) {
    if (absl::Status s = define(graph.inputs(i), absl::StrCat("input ", i)); !s.ok()) return s;
  }
  if (graph.num_bound_inputs() > static_cast<uint32_t>(graph.inputs_size())) {
    return Invalid(absl::StrCat("num_bound_inputs ", graph.num_bound_inputs(), " exceeds the ",
                                graph.inputs_size(), " inputs"));
  }
  for (int i = 0; i < graph.constants_size(); ++i) {
    const kiln::v1::Constant& constant = graph.constants(i);
    std::string where = absl::StrCat("constant ", i);
    if (absl::Status s = define(constant.value(), where); !s.ok()) return s;
    const TensorMeta& meta = constant.value().meta();
    if (IsSymbolic(meta)) return Invalid(where + ": constants have static sizes");
    if (!IsContiguous(meta)) return Invalid(where + ": constants must be contiguous");
    int64_t numel = 1;
    for (int64_t size : meta.sizes()) numel *= size;
    if (static_cast<uint64_t>(numel) * ElementSize(meta.dtype()) != constant.data().size()) {
      return Invalid(where + ": data size does not match its metadata");
    }
  }
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const kiln::v1::Node& node = graph.nodes(i);
    std::string where = absl::StrCat("node ", i, " (", node.op(), ")");
    auto declared = schemas.find(node.op());
    if (absl::Status s = AdmitOp(node, ops, declared == schemas.end() ? nullptr : declared->second);
        !s.ok()) {
      return Invalid(absl::StrCat("node ", i, ": ", s.message()));
    }
    if (node.args_size() > limits.max_args_per_node) return Invalid(where + ": too many args");
    for (const Argument& arg : node.args()) {
      if (arg.name().size() > 128) return Invalid(where + ": argument name too long");
      switch (arg.kind_case()) {
        case Argument::kValue:
          if (!defined.count(arg.value())) {
            return Invalid(absl::StrCat(where, ": uses undefined value ", arg.value()));
          }
          break;
        case Argument::kValueList:
          for (uint32_t id : arg.value_list().ids()) {
            if (!defined.count(id)) {
              return Invalid(absl::StrCat(where, ": uses undefined value ", id));
            }
          }
          break;
        case Argument::kDtypeValue:
          if (ElementSize(arg.dtype_value()) == 0) return Invalid(where + ": invalid dtype arg");
          break;
        case Argument::kStringValue:
          if (arg.string_value().size() > 128) return Invalid(where + ": string arg too long");
          break;
        case Argument::kDeviceValue:
          if (arg.device_value().kind() == kiln::v1::DEVICE_KIND_UNSPECIFIED ||
              !kiln::v1::DeviceKind_IsValid(arg.device_value().kind()) ||
              arg.device_value().index() < 0) {
            return Invalid(where + ": invalid device arg");
          }
          break;
        case Argument::kMemoryFormatValue:
          if (arg.memory_format_value() == kiln::v1::MEMORY_FORMAT_UNSPECIFIED ||
              !kiln::v1::MemoryFormat_IsValid(arg.memory_format_value())) {
            return Invalid(where + ": invalid memory format arg");
          }
          break;
        case Argument::kLayoutValue:
          if (arg.layout_value() != kiln::v1::LAYOUT_STRIDED) {
            return Invalid(where + ": invalid layout arg");
          }
          break;
        case Argument::kSymIntValue:
          if (absl::Status s = valid_expr(arg.sym_int_value(), where); !s.ok()) return s;
          break;
        case Argument::kSymIntList:
          if (arg.sym_int_list().values_size() > limits.max_rank) {
            return Invalid(where + ": SymInt list too long");
          }
          for (const kiln::v1::SymExpr& e : arg.sym_int_list().values()) {
            if (absl::Status s = valid_expr(e, where); !s.ok()) return s;
          }
          break;
        case Argument::KIND_NOT_SET:
          return Invalid(where + ": argument without a value");
        default:
          break;
      }
    }
    if (node.outputs_size() == 0) return Invalid(where + ": defines no value");
    for (const Value& out : node.outputs()) {
      if (absl::Status s = define(out, where); !s.ok()) return s;
    }
  }
  if (graph.outputs_size() == 0) return Invalid("graph returns nothing");
  for (uint32_t id : graph.outputs()) {
    if (!defined.count(id)) return Invalid(absl::StrCat("graph output ", id, " is undefined"));
  }
  if (absl::Status s = ValidateSizeSymbols(graph); !s.ok()) return s;
  return ValidateInputUpdates(graph, limits, defined);
}

}  // namespace kiln::compiler
