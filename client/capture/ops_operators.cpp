// Opcode handlers for operators (binary, comparison, unary, intrinsics) and for the value
// stack's own shuffles (PUSH_NULL, POP_TOP, COPY, SWAP).
#include "capture/translator.h"

namespace kiln::capture {

bool Translator::OpPushNull(const Instruction& inst) {
  Push(host_->NullVariable());
  return false;
}

bool Translator::OpPopTop(const Instruction& inst) {
  Pop();
  return false;
}

bool Translator::OpCopy(const Instruction& inst) {
  Push(Peek(inst.arg));
  return false;
}

bool Translator::OpSwap(const Instruction& inst) {
  std::swap(Peek(1), Peek(inst.arg));
  return false;
}

bool Translator::OpBinaryOp(const Instruction& inst) {
  if (inst.arg < 0 || static_cast<size_t>(inst.arg) >= Std().binary_ops.size()) {
    Unsupported("BINARY_OP " + std::to_string(inst.arg));
  }
  py::object b = Pop();
  py::object a = Pop();
  Push(Operator(Std().binary_ops[inst.arg], {a, b}));
  return false;
}

bool Translator::OpCompareOp(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object b = Pop();
  py::object a = Pop();
  Push(Operator(Std().compare_ops[argval], {a, b}));
  return false;
}

bool Translator::OpIsOp(const Instruction& inst) {
  py::object b = Pop();
  py::object a = Pop();
  Push(Operator(inst.arg ? Std().is_not : Std().is_, {a, b}));
  return false;
}

bool Translator::OpContainsOp(const Instruction& inst) {
  py::object container = Pop();
  py::object item = Pop();
  py::object result = Operator(Std().contains, {container, item});
  if (inst.arg) result = Constant(py::bool_(!PyObject_IsTrue(AsConstant(result).ptr())));
  Push(result);
  return false;
}

bool Translator::OpUnaryNegative(const Instruction& inst) {
  Push(Operator(Std().neg, {Pop()}));
  return false;
}

bool Translator::OpUnaryPositive(const Instruction& inst) {
  Push(Operator(Std().pos, {Pop()}));
  return false;
}

bool Translator::OpUnaryInvert(const Instruction& inst) {
  Push(Operator(Std().invert, {Pop()}));
  return false;
}

bool Translator::OpUnaryNot(const Instruction& inst) {
  Push(Constant(py::bool_(!Truth(Pop()))));
  return false;
}

bool Translator::OpCallIntrinsic1(const Instruction& inst) {
  // 3.12
  if (inst.arg == 5) {  // INTRINSIC_UNARY_POSITIVE
    Push(Operator(Std().pos, {Pop()}));
  } else if (inst.arg == 6) {  // INTRINSIC_LIST_TO_TUPLE
    Push(host_->TupleVariable(Unpack(Pop())));
  } else {
    std::string name = std::to_string(inst.arg);
    if (!Std().intrinsic1_names.is_none() &&
        static_cast<size_t>(inst.arg) < py::len(Std().intrinsic1_names)) {
      name = Str(Std().intrinsic1_names[py::int_(inst.arg)]);
    }
    Unsupported("CALL_INTRINSIC_1 " + name);
  }
  return false;
}

}  // namespace kiln::capture
