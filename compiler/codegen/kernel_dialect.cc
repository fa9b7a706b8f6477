// The expressions both generators write through a KernelDialect.
#include "compiler/codegen/kernel_dialect.h"

#include <cstdio>
#include <optional>
#include <vector>

#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {

using kiln::v1::Argument;

std::string StorageType(kiln::v1::DType dtype) {
  switch (dtype) {
    case kiln::v1::DTYPE_FLOAT32:
      return "float";
    case kiln::v1::DTYPE_FLOAT64:
      return "double";
    case kiln::v1::DTYPE_FLOAT16:
      return "_Float16";
    case kiln::v1::DTYPE_BFLOAT16:
      return "uint16_t";
    case kiln::v1::DTYPE_INT8:
      return "int8_t";
    case kiln::v1::DTYPE_INT16:
      return "int16_t";
    case kiln::v1::DTYPE_INT32:
      return "int32_t";
    case kiln::v1::DTYPE_INT64:
      return "int64_t";
    case kiln::v1::DTYPE_UINT8:
      return "uint8_t";
    case kiln::v1::DTYPE_BOOL:
      return "bool";
    default:
      return "";
  }
}

std::string NodeExpression(const kiln::v1::Node& node,
                           const std::unordered_map<uint32_t, std::string>& var, RoundFn rounded) {
  const PointwiseOp& op = *FindPointwise(node.op());
  const auto& out = node.outputs(0);
  const std::string type = ComputeType(out.meta().dtype());
  std::vector<std::optional<Operand>> operands(op.formals.size());
  const auto bound = *BindArguments(node, op.formals);  // IsFusable bound them already
  for (size_t pos = 0; pos < bound.size(); ++pos) {
    const Argument* a = bound[pos];
    if (a == nullptr || a->kind_case() == Argument::kNone || op.IsStorageFormal(op.formals[pos])) {
      continue;
    }
    if (a->kind_case() == Argument::kValue) {
      const std::string& v = var.at(a->value());
      operands[pos] = Operand{op.keeps_operand_types ? v : "(" + type + ")" + v, true, 0};
      continue;
    }
    std::string lit = *ScalarLiteral(*a);
    if (a->kind_case() != Argument::kStringValue && !op.keeps_operand_types) {
      lit = "(" + type + ")" + lit;
    }
    operands[pos] = Operand{lit, false, ScalarValue(*a)};
  }
  return rounded(out.meta().dtype(), "(" + type + ")" + *op.Emit(operands, type));
}

std::string VarianceExpression(const Reduction& r, const std::string& m2, const std::string& count,
                               const std::string& type, const std::string& math) {
  char correction[64];
  std::snprintf(correction, sizeof correction, "%a", r.correction);
  const std::string var =
      m2 + " / " + math + "max((" + type + ")0, " + count + " - (" + type + ")" + correction + ")";
  return r.kind == ReductionKind::kStd ? math + "sqrt(" + var + ")" : var;
}

}  // namespace kiln::compiler
