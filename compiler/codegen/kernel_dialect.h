// How the generated code spells values, for both generators: a target's dialect (loads and stores
// between storage and compute types, the rounding eager applies after each op, its math
// functions) and the expressions written in it (a pointwise node's, a variance's).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "compiler/ir/reduction_ops.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// The value as eager PyTorch holds it after an op whose output has `dtype`: `value`, of the
// compute type, rounded to the storage type and widened again (a bf16 result rounded to bf16).
using RoundFn = std::string (*)(kiln::v1::DType dtype, const std::string& value);

struct KernelDialect {
  // The compute-type value of element `ref` of a tensor of `dtype`.
  std::string (*load)(kiln::v1::DType dtype, const std::string& ref);
  // `value`, of the compute type, as stored in a tensor of `dtype`.
  std::string (*store)(kiln::v1::DType dtype, const std::string& value);
  RoundFn rounded;
  const char* math;  // what prefixes math functions: "std::" in C++ kernels, "::" in CUDA ones
};

// C++ storage type of a dtype in host code ("" when the generators do not handle it).
std::string StorageType(kiln::v1::DType dtype);

// The expression of pointwise node `node` (IsFusable), rounded with `rounded`; `var` names the
// expressions holding its tensor operands (already in their compute types).
std::string NodeExpression(const kiln::v1::Node& node,
                           const std::unordered_map<uint32_t, std::string>& var, RoundFn rounded);

// The expression of a var or std result from `m2` (the row's sum of squared deviations from its
// mean) over `count` elements: m2 / max(0, count - correction), its square root for kStd, in the
// compute type `type`; `math` prefixes the functions called (KernelDialect::math).
std::string VarianceExpression(const Reduction& r, const std::string& m2, const std::string& count,
                               const std::string& type, const std::string& math);

}  // namespace kiln::compiler
