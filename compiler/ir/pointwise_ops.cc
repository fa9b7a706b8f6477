// The pointwise op table. Expressions follow eager PyTorch's semantics on the compute type:
// NaN propagates through relu/clamp/maximum, round is half-to-even, division is true division.
#include "compiler/ir/pointwise_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;
using Args = std::vector<std::optional<Operand>>;
using Out = std::optional<std::string>;

// Set when an emitter reads an operand the node did not bind (a malformed node: ATen would
// refuse it too); PointwiseOp::Emit then answers that the op cannot be generated.
thread_local bool missing_operand = false;

std::string A(const Args& a, size_t i) {
  if (i >= a.size() || !a[i].has_value()) {
    missing_operand = true;
    return "0";
  }
  return a[i]->expr;
}
bool Has(const Args& a, size_t i) { return i < a.size() && a[i].has_value(); }
bool IsFloat(const std::string& t) { return t == "float" || t == "double"; }

std::string Call(const std::string& fn, const std::string& x, const std::string& t) {
  return "((" + t + ")std::" + fn + "(" + x + "))";
}

Out Add(const Args& a, const std::string& t) {
  if (Has(a, 2)) return "(" + A(a, 0) + " + (" + t + ")(" + A(a, 1) + " * " + A(a, 2) + "))";
  return "(" + A(a, 0) + " + " + A(a, 1) + ")";
}
Out Sub(const Args& a, const std::string& t) {
  if (Has(a, 2)) return "(" + A(a, 0) + " - (" + t + ")(" + A(a, 1) + " * " + A(a, 2) + "))";
  return "(" + A(a, 0) + " - " + A(a, 1) + ")";
}
Out Rsub(const Args& a, const std::string& t) {
  if (Has(a, 2)) return "(" + A(a, 1) + " - (" + t + ")(" + A(a, 0) + " * " + A(a, 2) + "))";
  return "(" + A(a, 1) + " - " + A(a, 0) + ")";
}
Out Mul(const Args& a, const std::string& t) {
  if (t == "bool") return "(" + A(a, 0) + " && " + A(a, 1) + ")";
  return "(" + A(a, 0) + " * " + A(a, 1) + ")";
}
Out Div(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "(" + A(a, 0) + " / " + A(a, 1) + ")";
}
Out DivMode(const Args& a, const std::string& t) {
  if (!IsFloat(t) || !Has(a, 2)) return std::nullopt;
  const std::string& mode = A(a, 2);
  if (mode == "\"trunc\"") return Call("trunc", A(a, 0) + " / " + A(a, 1), t);
  if (mode == "\"floor\"") return Call("floor", A(a, 0) + " / " + A(a, 1), t);
  return std::nullopt;
}
Out Neg(const Args& a, const std::string& t) {
  if (t == "bool") return std::nullopt;
  return "(-" + A(a, 0) + ")";
}
Out Abs(const Args& a, const std::string& t) {
  if (t == "bool") return A(a, 0);
  return "(" + A(a, 0) + " < 0 ? (" + t + ")-" + A(a, 0) + " : " + A(a, 0) + ")";
}
#define KILN_FLOAT_FN(Name, fn)                   \
  Out Name(const Args& a, const std::string& t) { \
    if (!IsFloat(t)) return std::nullopt;         \
    return Call(fn, A(a, 0), t);                  \
  }
KILN_FLOAT_FN(Exp, "exp")
KILN_FLOAT_FN(Log, "log")
KILN_FLOAT_FN(Log1p, "log1p")
KILN_FLOAT_FN(Expm1, "expm1")
KILN_FLOAT_FN(Sqrt, "sqrt")
KILN_FLOAT_FN(Sin, "sin")
KILN_FLOAT_FN(Cos, "cos")
KILN_FLOAT_FN(Tanh, "tanh")
KILN_FLOAT_FN(Erf, "erf")
KILN_FLOAT_FN(Floor, "floor")
KILN_FLOAT_FN(Ceil, "ceil")
KILN_FLOAT_FN(Trunc, "trunc")
KILN_FLOAT_FN(Round, "nearbyint")
#undef KILN_FLOAT_FN
Out Rsqrt(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "((" + t + ")1 / std::sqrt(" + A(a, 0) + "))";
}
Out Reciprocal(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "((" + t + ")1 / " + A(a, 0) + ")";
}
Out Sigmoid(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "((" + t + ")1 / ((" + t + ")1 + std::exp(-" + A(a, 0) + ")))";
}
Out Silu(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "(" + A(a, 0) + " / ((" + t + ")1 + std::exp(-" + A(a, 0) + ")))";
}
Out Gelu(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  const std::string x = A(a, 0);
  if (!Has(a, 1) || A(a, 1) == "\"none\"") {
    return "((" + t + ")0.5 * " + x + " * ((" + t + ")1 + std::erf(" + x + " * (" + t +
           ")0.70710678118654752440)))";
  }
  if (A(a, 1) == "\"tanh\"") {
    return "((" + t + ")0.5 * " + x + " * ((" + t + ")1 + std::tanh((" + t +
           ")0.79788456080286535588 * (" + x + " + (" + t + ")0.044715 * " + x + " * " + x + " * " +
           x + "))))";
  }
  return std::nullopt;
}
Out Relu(const Args& a, const std::string& t) {
  if (t == "bool") return A(a, 0);
  return "(" + A(a, 0) + " < 0 ? (" + t + ")0 : " + A(a, 0) + ")";
}
// max/min that propagate NaN (the first argument's NaN survives the comparison).
std::string Max(const std::string& x, const std::string& y) {
  return "(" + x + " < " + y + " ? " + y + " : " + x + ")";
}
std::string Min(const std::string& x, const std::string& y) {
  return "(" + y + " < " + x + " ? " + y + " : " + x + ")";
}
Out Clamp(const Args& a, const std::string& t) {
  if (t == "bool") return std::nullopt;
  std::string e = A(a, 0);
  if (Has(a, 1)) e = Max(e, "(" + t + ")" + A(a, 1));
  if (Has(a, 2)) e = Min(e, "(" + t + ")" + A(a, 2));
  return e;
}
Out ClampMin(const Args& a, const std::string& t) {
  if (t == "bool") return std::nullopt;
  return Max(A(a, 0), "(" + t + ")" + A(a, 1));
}
Out ClampMax(const Args& a, const std::string& t) {
  if (t == "bool") return std::nullopt;
  return Min(A(a, 0), "(" + t + ")" + A(a, 1));
}
Out Hardtanh(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  std::string lo = Has(a, 1) ? A(a, 1) : "-1", hi = Has(a, 2) ? A(a, 2) : "1";
  return Min(Max(A(a, 0), "(" + t + ")" + lo), "(" + t + ")" + hi);
}
Out LeakyRelu(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  std::string slope = Has(a, 1) ? A(a, 1) : "0.01";
  return "(" + A(a, 0) + " < 0 ? (" + t + ")(" + A(a, 0) + " * " + slope + ") : " + A(a, 0) + ")";
}
Out Hardsigmoid(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return Min(Max("(" + A(a, 0) + " / (" + t + ")6 + (" + t + ")0.5)", "(" + t + ")0"),
             "(" + t + ")1");
}
Out Hardswish(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "(" + A(a, 0) + " * " +
         Min(Max("(" + A(a, 0) + " + (" + t + ")3)", "(" + t + ")0"), "(" + t + ")6") + " / (" + t +
         ")6)";
}
Out Maximum(const Args& a, const std::string& t) {
  if (t == "bool") return "(" + A(a, 0) + " || " + A(a, 1) + ")";
  // NaN in either operand gives NaN.
  return "(" + A(a, 0) + " != " + A(a, 0) + " ? " + A(a, 0) + " : " + Max(A(a, 1), A(a, 0)) + ")";
}
Out Minimum(const Args& a, const std::string& t) {
  if (t == "bool") return "(" + A(a, 0) + " && " + A(a, 1) + ")";
  return "(" + A(a, 0) + " != " + A(a, 0) + " ? " + A(a, 0) + " : " + Min(A(a, 1), A(a, 0)) + ")";
}
Out Where(const Args& a, const std::string& t) {
  return "(" + A(a, 0) + " ? (" + t + ")" + A(a, 1) + " : (" + t + ")" + A(a, 2) + ")";
}
Out PowScalar(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  if (a[1]->is_tensor) return std::nullopt;
  const std::string x = A(a, 0), e = A(a, 1);
  const double v = a[1]->value;
  if (v == 2) return "(" + x + " * " + x + ")";
  if (v == 3) return "(" + x + " * " + x + " * " + x + ")";
  if (v == 1) return x;
  if (v == 0.5) return Call("sqrt", x, t);
  if (v == -1) return "((" + t + ")1 / " + x + ")";
  return "((" + t + ")std::pow(" + x + ", (" + t + ")" + e + "))";
}
Out PowTensor(const Args& a, const std::string& t) {
  if (!IsFloat(t)) return std::nullopt;
  return "((" + t + ")std::pow(" + A(a, 0) + ", " + A(a, 1) + "))";
}
Out Sign(const Args& a, const std::string& t) {
  if (t == "bool") return A(a, 0);
  return "((" + t + ")((" + A(a, 0) + " > 0) - (" + A(a, 0) + " < 0)))";
}
#define KILN_COMPARE(Name, opr)                         \
  Out Name(const Args& a, const std::string&) {         \
    return "(" + A(a, 0) + " " opr " " + A(a, 1) + ")"; \
  }
KILN_COMPARE(Eq, "==")
KILN_COMPARE(Ne, "!=")
KILN_COMPARE(Lt, "<")
KILN_COMPARE(Le, "<=")
KILN_COMPARE(Gt, ">")
KILN_COMPARE(Ge, ">=")
#undef KILN_COMPARE
Out LogicalNot(const Args& a, const std::string&) { return "(!(" + A(a, 0) + "))"; }
Out LogicalAnd(const Args& a, const std::string&) {
  return "((bool)(" + A(a, 0) + ") && (bool)(" + A(a, 1) + "))";
}
Out LogicalOr(const Args& a, const std::string&) {
  return "((bool)(" + A(a, 0) + ") || (bool)(" + A(a, 1) + "))";
}
Out BitAnd(const Args& a, const std::string& t) {
  if (t == "float" || t == "double") return std::nullopt;
  return "(" + A(a, 0) + " & " + A(a, 1) + ")";
}
Out BitOr(const Args& a, const std::string& t) {
  if (t == "float" || t == "double") return std::nullopt;
  return "(" + A(a, 0) + " | " + A(a, 1) + ")";
}
Out BitXor(const Args& a, const std::string& t) {
  if (t == "float" || t == "double") return std::nullopt;
  return "(" + A(a, 0) + " ^ " + A(a, 1) + ")";
}
Out BitNot(const Args& a, const std::string& t) {
  if (t == "bool") return "(!" + A(a, 0) + ")";
  if (t == "float" || t == "double") return std::nullopt;
  return "(~" + A(a, 0) + ")";
}
Out Identity(const Args& a, const std::string&) { return A(a, 0); }

const std::unordered_map<std::string, PointwiseOp>& Table() {
  using V = std::vector<std::string>;
  static const auto* table = new std::unordered_map<std::string, PointwiseOp>{
      {"aten::add.Tensor", {V{"self", "other", "alpha"}, V{"self", "other"}, false, Add}},
      {"aten::add.Scalar", {V{"self", "other", "alpha"}, V{"self"}, false, Add}},
      {"aten::sub.Tensor", {V{"self", "other", "alpha"}, V{"self", "other"}, false, Sub}},
      {"aten::sub.Scalar", {V{"self", "other", "alpha"}, V{"self"}, false, Sub}},
      {"aten::rsub.Scalar", {V{"self", "other", "alpha"}, V{"self"}, false, Rsub}},
      {"aten::rsub.Tensor", {V{"self", "other", "alpha"}, V{"self", "other"}, false, Rsub}},
      {"aten::mul.Tensor", {V{"self", "other"}, V{"self", "other"}, false, Mul}},
      {"aten::mul.Scalar", {V{"self", "other"}, V{"self"}, false, Mul}},
      {"aten::div.Tensor", {V{"self", "other"}, V{"self", "other"}, false, Div}},
      {"aten::div.Scalar", {V{"self", "other"}, V{"self"}, false, Div}},
      {"aten::div.Tensor_mode",
       {V{"self", "other", "rounding_mode"}, V{"self", "other"}, false, DivMode}},
      {"aten::neg", {V{"self"}, V{"self"}, false, Neg}},
      {"aten::abs", {V{"self"}, V{"self"}, false, Abs}},
      {"aten::exp", {V{"self"}, V{"self"}, false, Exp}},
      {"aten::log", {V{"self"}, V{"self"}, false, Log}},
      {"aten::log1p", {V{"self"}, V{"self"}, false, Log1p}},
      {"aten::expm1", {V{"self"}, V{"self"}, false, Expm1}},
      {"aten::sqrt", {V{"self"}, V{"self"}, false, Sqrt}},
      {"aten::rsqrt", {V{"self"}, V{"self"}, false, Rsqrt}},
      {"aten::reciprocal", {V{"self"}, V{"self"}, false, Reciprocal}},
      {"aten::sin", {V{"self"}, V{"self"}, false, Sin}},
      {"aten::cos", {V{"self"}, V{"self"}, false, Cos}},
      {"aten::tanh", {V{"self"}, V{"self"}, false, Tanh}},
      {"aten::erf", {V{"self"}, V{"self"}, false, Erf}},
      {"aten::floor", {V{"self"}, V{"self"}, false, Floor}},
      {"aten::ceil", {V{"self"}, V{"self"}, false, Ceil}},
      {"aten::trunc", {V{"self"}, V{"self"}, false, Trunc}},
      {"aten::round", {V{"self"}, V{"self"}, false, Round}},
      {"aten::sigmoid", {V{"self"}, V{"self"}, false, Sigmoid}},
      {"aten::silu", {V{"self"}, V{"self"}, false, Silu}},
      {"aten::gelu", {V{"self", "approximate"}, V{"self"}, false, Gelu}},
      {"aten::relu", {V{"self"}, V{"self"}, false, Relu}},
      {"aten::clamp", {V{"self", "min", "max"}, V{"self"}, false, Clamp}},
      {"aten::clamp_min", {V{"self", "min"}, V{"self"}, false, ClampMin}},
      {"aten::clamp_max", {V{"self", "max"}, V{"self"}, false, ClampMax}},
      {"aten::hardtanh", {V{"self", "min_val", "max_val"}, V{"self"}, false, Hardtanh}},
      {"aten::leaky_relu", {V{"self", "negative_slope"}, V{"self"}, false, LeakyRelu}},
      {"aten::hardsigmoid", {V{"self"}, V{"self"}, false, Hardsigmoid}},
      {"aten::hardswish", {V{"self"}, V{"self"}, false, Hardswish}},
      {"aten::maximum", {V{"self", "other"}, V{"self", "other"}, false, Maximum}},
      {"aten::minimum", {V{"self", "other"}, V{"self", "other"}, false, Minimum}},
      {"aten::where.self",
       {V{"condition", "self", "other"}, V{"condition", "self", "other"}, true, Where}},
      {"aten::pow.Tensor_Scalar", {V{"self", "exponent"}, V{"self"}, false, PowScalar}},
      {"aten::pow.Tensor_Tensor", {V{"self", "exponent"}, V{"self", "exponent"}, false, PowTensor}},
      {"aten::sign", {V{"self"}, V{"self"}, false, Sign}},
      {"aten::eq.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Eq}},
      {"aten::eq.Scalar", {V{"self", "other"}, V{"self"}, true, Eq}},
      {"aten::ne.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Ne}},
      {"aten::ne.Scalar", {V{"self", "other"}, V{"self"}, true, Ne}},
      {"aten::lt.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Lt}},
      {"aten::lt.Scalar", {V{"self", "other"}, V{"self"}, true, Lt}},
      {"aten::le.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Le}},
      {"aten::le.Scalar", {V{"self", "other"}, V{"self"}, true, Le}},
      {"aten::gt.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Gt}},
      {"aten::gt.Scalar", {V{"self", "other"}, V{"self"}, true, Gt}},
      {"aten::ge.Tensor", {V{"self", "other"}, V{"self", "other"}, true, Ge}},
      {"aten::ge.Scalar", {V{"self", "other"}, V{"self"}, true, Ge}},
      {"aten::logical_not", {V{"self"}, V{"self"}, true, LogicalNot}},
      {"aten::logical_and", {V{"self", "other"}, V{"self", "other"}, true, LogicalAnd}},
      {"aten::logical_or", {V{"self", "other"}, V{"self", "other"}, true, LogicalOr}},
      {"aten::bitwise_and.Tensor", {V{"self", "other"}, V{"self", "other"}, false, BitAnd}},
      {"aten::bitwise_or.Tensor", {V{"self", "other"}, V{"self", "other"}, false, BitOr}},
      {"aten::bitwise_xor.Tensor", {V{"self", "other"}, V{"self", "other"}, false, BitXor}},
      {"aten::bitwise_not", {V{"self"}, V{"self"}, false, BitNot}},
      {"aten::clone", {V{"self", "memory_format"}, V{"self"}, false, Identity, V{"memory_format"}}},
      {"aten::_to_copy",
       {V{"self", "dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"},
        V{"self"}, false, Identity,
        V{"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"}}},
  };
  return *table;
}

}  // namespace

std::optional<std::string> PointwiseOp::Emit(const std::vector<std::optional<Operand>>& args,
                                             const std::string& type) const {
  missing_operand = false;
  std::optional<std::string> expr = emit(args, type);
  if (missing_operand) return std::nullopt;
  return expr;
}

const PointwiseOp* FindPointwise(const std::string& op) {
  auto it = Table().find(op);
  return it == Table().end() ? nullptr : &it->second;
}

bool PointwiseOp::IsTensorFormal(const std::string& formal) const {
  return std::find(tensor_formals.begin(), tensor_formals.end(), formal) != tensor_formals.end();
}

bool PointwiseOp::IsStorageFormal(const std::string& formal) const {
  return std::find(storage_formals.begin(), storage_formals.end(), formal) != storage_formals.end();
}

std::optional<std::vector<const kiln::v1::Argument*>> BindArguments(
    const kiln::v1::Node& node, const std::vector<std::string>& formals) {
  std::vector<const kiln::v1::Argument*> bound(formals.size(), nullptr);
  size_t next = 0;
  for (const kiln::v1::Argument& a : node.args()) {
    size_t pos;
    if (a.name().empty()) {
      pos = next++;
    } else {
      auto it = std::find(formals.begin(), formals.end(), a.name());
      if (it == formals.end()) return std::nullopt;
      pos = static_cast<size_t>(it - formals.begin());
    }
    if (pos >= bound.size() || bound[pos] != nullptr) return std::nullopt;
    bound[pos] = &a;
  }
  return bound;
}

double ScalarValue(const kiln::v1::Argument& arg) {
  switch (arg.kind_case()) {
    case kiln::v1::Argument::kFloatValue:
      return arg.float_value();
    case kiln::v1::Argument::kIntValue:
      return static_cast<double>(arg.int_value());
    case kiln::v1::Argument::kBoolValue:
      return arg.bool_value() ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

bool IsFloatingDType(kiln::v1::DType dtype) {
  return dtype == kiln::v1::DTYPE_FLOAT32 || dtype == kiln::v1::DTYPE_FLOAT64 ||
         dtype == kiln::v1::DTYPE_BFLOAT16 || dtype == kiln::v1::DTYPE_FLOAT16;
}

std::string ComputeType(kiln::v1::DType dtype) {
  switch (dtype) {
    case kiln::v1::DTYPE_FLOAT32:
    case kiln::v1::DTYPE_FLOAT16:
    case kiln::v1::DTYPE_BFLOAT16:
      return "float";
    case kiln::v1::DTYPE_FLOAT64:
      return "double";
    case kiln::v1::DTYPE_INT8:
    case kiln::v1::DTYPE_INT16:
    case kiln::v1::DTYPE_INT32:
    case kiln::v1::DTYPE_INT64:
    case kiln::v1::DTYPE_UINT8:
      return "int64_t";
    case kiln::v1::DTYPE_BOOL:
      return "bool";
    default:
      return "";
  }
}

std::optional<std::string> ScalarLiteral(const kiln::v1::Argument& arg) {
  switch (arg.kind_case()) {
    case kiln::v1::Argument::kIntValue:
      return "INT64_C(" + std::to_string(arg.int_value()) + ")";
    case kiln::v1::Argument::kBoolValue:
      return arg.bool_value() ? "true" : "false";
    case kiln::v1::Argument::kFloatValue: {
      double v = arg.float_value();
      if (std::isnan(v)) return "(double)NAN";
      if (std::isinf(v)) return v > 0 ? "(double)INFINITY" : "(-(double)INFINITY)";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", v);
      std::string s = buf;
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      return "(" + s + ")";
    }
    case kiln::v1::Argument::kStringValue: {
      // Modes ("trunc", "tanh"): compared against known names, never emitted; still, only
      // lowercase identifiers pass.
      const std::string& s = arg.string_value();
      if (s.empty() || s.size() > 16) return std::nullopt;
      for (char c : s) {
        if (!((c >= 'a' && c <= 'z') || c == '_')) return std::nullopt;
      }
      return "\"" + s + "\"";
    }
    default:
      return std::nullopt;
  }
}

}  // namespace kiln::compiler
