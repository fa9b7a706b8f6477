// The pointwise ops of the IR's vocabulary, those the fuser puts in kernels: for each, its formal
// arguments and the C++ expression it computes (what the code generators emit). Expressions call
// math as std::<fn> (exp, log, pow, ...) and use INFINITY, NAN and INT64_C: each generator's
// prelude makes those resolve on its target.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// One operand of a pointwise expression: a C++ expression already in `type` (the compute type).
struct Operand {
  std::string expr;
  bool is_tensor = false;
  double value = 0;  // the number, for scalar literals
};

// A pointwise op as the code generator sees it. `Emit` gets the operands bound to `formals`
// (absent optional arguments are nullopt) and the C++ compute type of the result, and returns
// the expression, or nullopt when this instance cannot be generated (then it is a library call).
struct PointwiseOp {
  std::vector<std::string> formals;
  // Formals that may hold tensors; every other formal must be a scalar literal.
  std::vector<std::string> tensor_formals;
  // True when tensor operands are compared rather than computed with (eq, lt, where's cond):
  // they are then not converted to the result's type.
  bool keeps_operand_types = false;
  std::optional<std::string> (*emit)(const std::vector<std::optional<Operand>>& args,
                                     const std::string& type);
  // Formals that only say how the result is stored (dtype, layout, device, memory format of
  // _to_copy and clone): the output's TensorMeta already carries them, so they never reach
  // `emit`.
  std::vector<std::string> storage_formals = {};

  // `emit`, or nullopt also when it needs an operand the node did not bind: what the fuser and
  // the code generator call.
  std::optional<std::string> Emit(const std::vector<std::optional<Operand>>& args,
                                  const std::string& type) const;
  bool IsTensorFormal(const std::string& formal) const;
  bool IsStorageFormal(const std::string& formal) const;
};

// Binds a node's arguments to `formals` (positional first, then by name); nullopt when an
// argument is unknown or given twice. Unbound formals are nullptr.
std::optional<std::vector<const kiln::v1::Argument*>> BindArguments(
    const kiln::v1::Node& node, const std::vector<std::string>& formals);

// The number a scalar argument holds (int, float or bool; 0 for other kinds).
double ScalarValue(const kiln::v1::Argument& arg);

// The pointwise op named `op` (schema name with overload), or nullptr.
const PointwiseOp* FindPointwise(const std::string& op);

// C++ compute type of a dtype: what kernels compute its values in ("" when the generators do not
// handle it).
std::string ComputeType(kiln::v1::DType dtype);

// float32, float64, bfloat16 and float16.
bool IsFloatingDType(kiln::v1::DType dtype);

// A C++ literal for a scalar argument (int, float or bool), or nullopt for other kinds.
std::optional<std::string> ScalarLiteral(const kiln::v1::Argument& arg);

}  // namespace kiln::compiler
