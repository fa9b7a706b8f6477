// The ATen ops the CPU code generator fuses: for each pointwise op, its formal arguments and the
// C++ expression it computes; and the ops that return an alias of their input (views).
#pragma once

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
};

// The pointwise op named `op` (schema name with overload), or nullptr.
const PointwiseOp* FindPointwise(const std::string& op);

// True for ops whose result may alias their first input (view, permute, expand, reshape, ...).
bool IsViewOp(const std::string& op);

// C++ storage and compute types of a dtype ("" when the generator does not handle it).
std::string StorageType(kiln::v1::DType dtype);
std::string ComputeType(kiln::v1::DType dtype);

// A C++ literal for a scalar argument (int, float or bool), or nullopt for other kinds.
std::optional<std::string> ScalarLiteral(const kiln::v1::Argument& arg);

}  // namespace kiln::compiler
