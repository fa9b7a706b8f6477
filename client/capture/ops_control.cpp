// Opcode handlers for control flow: jumps, branches on trace-time values, iteration, and
// returning.
#include "capture/translator.h"

namespace kiln::capture {

bool Translator::OpJump(const Instruction& inst) {
  JumpTo(inst);
  return false;
}

bool Translator::OpGetIter(const Instruction& inst) {
  py::object obj = Pop();
  Push(host_->ListIteratorVariable.attr("of")(Self(), obj));
  return false;
}

bool Translator::OpForIter(const Instruction& inst) {
  py::object it = Peek(1);
  if (!py::isinstance(it, host_->ListIteratorVariable)) Unsupported("iteration over " + Str(it));
  py::object item = it.attr("next_item")();
  if (!item.is_none()) {
    Push(item);
    return false;
  }
  Pop();
  JumpTo(inst);
  // 3.12: the exhausted iterator skips the END_FOR its jump names.
  const auto& insts = decoded_->instructions;
  if (static_cast<size_t>(ip_) < insts.size() &&
      OpTable()[insts[ip_].opcode].handler == &Translator::OpEndFor) {
    ++ip_;
  }
  return false;
}

bool Translator::OpEndFor(const Instruction& inst) {
  // reached only by falling through in 3.12
  Pop();
  Pop();
  return false;
}

bool Translator::BranchOn(const Instruction& inst, bool wanted, bool pop_always) {
  if (Truth(Peek(1)) == wanted) {
    if (pop_always) Pop();
    JumpTo(inst);
  } else {
    Pop();
  }
  return false;
}

bool Translator::JumpIfNone(const Instruction& inst, bool if_none) {
  py::object value = Pop();
  const bool is_none =
      py::isinstance(value, host_->ConstantVariable) && value.attr("value").is_none();
  if (is_none == if_none) JumpTo(inst);
  return false;
}

bool Translator::OpReturnValue(const Instruction& inst) {
  return_value_ = Pop();
  return true;
}

bool Translator::OpReturnConst(const Instruction& inst) {
  return_value_ = Constant(Arg(inst));
  return true;
}

}  // namespace kiln::capture
