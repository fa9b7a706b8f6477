// Reading an ATen FunctionSchema's text (what torch prints for op._schema) without torch: the
// op's name, each argument's and result's type, and the alias annotations that say an argument
// is written or a result shares memory with an argument. The daemon reads the schemas a graph
// declares (kiln.v1.OpSchema) to admit ops outside its allowlist (op_admission.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::compiler {

// One argument or result: "Tensor(a!) self", "int[2] stride=[1, 1]", "Tensor output".
struct SchemaSlot {
  std::string type;      // The type without its alias annotation: "Tensor", "int[2]", "Tensor?[]".
  std::string name;      // Empty for an unnamed result.
  bool aliased = false;  // The type carries an alias annotation: "Tensor(a)", "Tensor(a!)[]".
  bool written = false;  // ... one that writes ("!").
  bool keyword_only = false;  // After "*".
};

struct OpSchemaText {
  std::string name;  // "aten::add.Tensor", "aten::nll_loss_forward".
  std::vector<SchemaSlot> arguments;
  std::vector<SchemaSlot> returns;
};

// The schema `text` read, or nullopt when it is not a FunctionSchema's text (unbalanced
// brackets or quotes, no argument list, no "->", an empty type).
std::optional<OpSchemaText> ParseOpSchema(std::string_view text);

// What a result of that type is to a plan.
enum class ResultKind {
  kTensor,      // Tensor, Tensor? (a library call binds it to a value; None binds undefined)
  kTensorList,  // Tensor[] (flattened into the call's values)
  kNumber,      // int, SymInt, float, SymFloat, bool, SymBool: no value stands for it
  kOther,       // anything else (Scalar, str, a list of numbers, ...): a plan cannot bind it
};
ResultKind ClassifyResult(std::string_view type);

}  // namespace kiln::compiler
