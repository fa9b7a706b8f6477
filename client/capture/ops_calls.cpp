// Opcode handlers for calls and what runs code: CALL and its keyword names, making functions,
// `with`, raise and assert, and generators run to their end.
#include "capture/translator.h"

namespace kiln::capture {

bool Translator::OpKwNames(const Instruction& inst) {
  kw_names_ = Arg(inst);
  return false;
}

bool Translator::OpCall(const Instruction& inst) {
  std::vector<py::object> args = PopN(static_cast<size_t>(inst.arg));
  py::object fn = Pop();
  py::object below = Pop();
  if (!IsNull(below)) {  // [callable, self, args...]
    args.insert(args.begin(), fn);
    fn = below;
  }
  py::dict kwargs;
  size_t npos = args.size();
  if (!kw_names_.is_none() && PyObject_IsTrue(kw_names_.ptr())) {
    py::tuple names = kw_names_;
    if (names.size() > args.size()) Unsupported("more keyword names than arguments");
    npos = args.size() - names.size();
    for (size_t i = 0; i < names.size(); ++i) kwargs[names[i]] = args[npos + i];
  }
  kw_names_ = py::none();
  args.resize(npos);
  Push(fn.attr("call_function")(Self(), ListOf(args), kwargs));
  return false;
}

bool Translator::OpCallFunctionEx(const Instruction& inst) {
  py::object kwargs_vt = (inst.arg & 1) ? Pop() : py::object(py::none());
  py::object args_vt = Pop();
  py::object fn = Pop();
  py::object below = Pop();
  if (!IsNull(below)) Unsupported("CALL_FUNCTION_EX without NULL");
  py::list args(Unpack(args_vt));
  py::dict kwargs;
  if (!kwargs_vt.is_none()) {
    if (!py::isinstance(kwargs_vt, host_->ConstDictVariable)) Unsupported("** of a non-dict");
    kwargs = py::dict(kwargs_vt.attr("items"));
  }
  Push(fn.attr("call_function")(Self(), args, kwargs));
  return false;
}

bool Translator::OpMakeFunction(const Instruction& inst) {
  const int flags = inst.arg;
  py::object code = AsConstant(Pop());  // 3.11+: the qualname comes from the code
  py::object closure = (flags & 0x08) ? py::object(Pop().attr("items")) : py::none();
  py::object annotations = (flags & 0x04) ? Pop() : py::object(py::none());
  py::object kwdefaults = (flags & 0x02) ? Pop() : py::object(py::none());
  py::object defaults = (flags & 0x01) ? Pop() : py::object(py::none());
  Push(host_->NestedFunctionVariable(code, code.attr("co_qualname"), defaults, kwdefaults, closure,
                                     f_globals_, annotations));
  return false;
}

bool Translator::OpBeforeWith(const Instruction& inst) {
  py::object ctx = Pop();
  Push(ctx.attr("enter")(Self()));
  Push(Constant(py::none()));  // what __enter__ returned
  return false;
}

bool Translator::OpLoadAssertionError(const Instruction& inst) {
  Unsupported("assert failed at trace time");
}

bool Translator::OpRaiseVarargs(const Instruction& inst) {
  Unsupported("raise statement reached at trace time");
}

bool Translator::OpReturnGenerator(const Instruction& inst) {
  if (generator_items_.is_none()) Unsupported("generator function");
  Push(Constant(py::none()));
  return false;
}

bool Translator::OpYieldValue(const Instruction& inst) {
  if (generator_items_.is_none()) Unsupported("yield");
  generator_items_.attr("append")(Pop());
  Push(Constant(py::none()));  // the value sent in
  return false;
}

}  // namespace kiln::capture
