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
    for (const auto& item : kwargs) {
      // Eager raises TypeError: keywords must be strings (a key may be a tensor here).
      if (!PyUnicode_Check(item.first.ptr())) Unsupported("** of a dict with a key not a str");
    }
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
  py::tuple entered = host_->enter_context(Self(), Pop());  // (the bound __exit__, __enter__'s)
  Push(entered[0]);
  Push(entered[1]);
  return false;
}

bool Translator::OpLoadAssertionError(const Instruction& inst) {
  Unsupported("assert failed at trace time");
}

// Raising: the exception's TracedException goes up to Run, which hands it to a handler (Catch).
bool Translator::OpRaiseVarargs(const Instruction& inst) {
  if (inst.arg == 0) {  // `raise`: the exception being handled, again
    if (!py::isinstance(exc_info_, host_->ExceptionVariable)) {
      Unsupported("raise with no exception that the trace is handling");
    }
    Raise(exc_info_.attr("traced")());
  }
  if (inst.arg == 1) {
    host_->raise_exception(Self(), Pop());
  } else {
    py::object cause = Pop();
    host_->raise_exception(Self(), Pop(), cause);
  }
  Unsupported("raise_exception returned");
}

bool Translator::OpReraise(const Instruction& inst) {
  // The argument only moves the traceback's line (f_lasti, from the value below): the handler
  // is looked up at this instruction, as CPython's exception_unwind does.
  py::object exc = Pop();
  if (!py::isinstance(exc, host_->ExceptionVariable)) Unsupported("RERAISE of " + Repr(exc));
  Raise(exc.attr("traced")());
}

bool Translator::OpPushExcInfo(const Instruction& inst) {
  py::object exc = Pop();
  Push(exc_info_);
  Push(exc);
  exc_info_ = exc;
  ++handlers_open_;
  return false;
}

bool Translator::OpPopExcept(const Instruction& inst) {
  exc_info_ = Pop();
  --handlers_open_;
  return false;
}

bool Translator::OpCheckExcMatch(const Instruction& inst) {
  py::object classes = AsConstant(Pop());
  py::object cls = Peek(1).attr("python_type")();
  // What CPython's check_except_type_valid lets through (else a TypeError, not modelled).
  bool valid = PyExceptionClass_Check(classes.ptr());
  if (PyTuple_Check(classes.ptr())) {
    valid = true;
    for (py::handle item : py::reinterpret_borrow<py::tuple>(classes)) {
      valid = valid && PyExceptionClass_Check(item.ptr());
    }
  }
  if (!valid) Unsupported("except over " + Repr(classes) + ", which are not exception classes");
  Push(Constant(py::bool_(PyErr_GivenExceptionMatches(cls.ptr(), classes.ptr()) != 0)));
  return false;
}

bool Translator::OpWithExceptStart(const Instruction& inst) {
  Unsupported(Repr(Peek(1)) + " inside a `with` block, whose __exit__ would see it");
}

// `yield from` inside a generator the executor runs to its end (a generator expression, a
// class's __iter__): delegating to an iterator the trace holds, one item a SEND. What is sent
// in is always None (YIELD_VALUE's), and an iterator returns None when it is done.
bool Translator::OpGetYieldFromIter(const Instruction& inst) {
  if (generator_items_.is_none()) Unsupported("yield from");
  return OpGetIter(inst);
}

bool Translator::OpSend(const Instruction& inst) {
  Pop();  // the value sent in: None
  py::object receiver = Peek(1);
  if (!py::isinstance(receiver, host_->ListIteratorVariable)) {
    Unsupported("yield from " + Repr(receiver));
  }
  py::object item = receiver.attr("next_item")();
  if (!item.is_none()) {
    Push(item);
    return false;
  }
  // Done: what `yield from` evaluates to, past the loop; 3.12 leaves the receiver for END_SEND.
  if (PY_VERSION_HEX < 0x030C0000) Pop();
  Push(Constant(py::none()));
  JumpTo(inst);
  return false;
}

bool Translator::OpEndSend(const Instruction& inst) {
  // 3.12
  py::object value = Pop();
  Pop();  // the receiver
  Push(value);
  return false;
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
