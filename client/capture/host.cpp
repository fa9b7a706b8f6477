// What the executor reads of Python: kiln's host object (the names CaptureHost gives it), the
// standard library's operators and helpers, and the small conversions the handlers share.
#include "capture/translator.h"

namespace kiln::capture {

std::shared_ptr<const Host> Host::Of(const py::object& obj) {
  static std::shared_ptr<const Host>* last = nullptr;  // under the GIL
  static PyObject* last_obj = nullptr;
  if (last != nullptr && last_obj == obj.ptr()) return *last;
  auto host = std::make_shared<Host>();
  for (auto [field, name] : std::initializer_list<std::pair<py::object Host::*, const char*>>{
           {&Host::Unsupported, "Unsupported"},
           {&Host::TracedException, "TracedException"},
           {&Host::GraphBreak, "GraphBreak"},
           {&Host::Checkpoint, "Checkpoint"},
           {&Host::VariableTracker, "VariableTracker"},
           {&Host::NullVariable, "NullVariable"},
           {&Host::LazyLocal, "LazyLocal"},
           {&Host::ConstantVariable, "ConstantVariable"},
           {&Host::TupleVariable, "TupleVariable"},
           {&Host::ListVariable, "ListVariable"},
           {&Host::SetVariable, "SetVariable"},
           {&Host::ConstDictVariable, "ConstDictVariable"},
           {&Host::SliceVariable, "SliceVariable"},
           {&Host::ListIteratorVariable, "ListIteratorVariable"},
           {&Host::CellVariable, "CellVariable"},
           {&Host::NestedFunctionVariable, "NestedFunctionVariable"},
           {&Host::SuperVariable, "SuperVariable"},
           {&Host::ExceptionVariable, "ExceptionVariable"},
           {&Host::wrap, "wrap"},
           {&Host::apply_operator, "apply_operator"},
           {&Host::raise_exception, "raise_exception"},
           {&Host::check_attribute_error, "check_attribute_error"},
           {&Host::enter_context, "enter_context"},
           {&Host::mark_checkpoint, "mark_checkpoint"},
           {&Host::mutation_count, "mutation_count"},
           {&Host::mutations_of, "mutations_of"},
           {&Host::traces_into, "traces_into"},
           {&Host::is_torch_file, "is_torch_file"},
           {&Host::can_split, "can_split"},
           {&Host::wrapped_first, "wrapped_first"},
           {&Host::LocalSource, "LocalSource"},
           {&Host::GlobalSource, "GlobalSource"},
           {&Host::ClosureSource, "ClosureSource"},
           {&Host::FrameCellSource, "FrameCellSource"},
           {&Host::ObjectSource, "ObjectSource"},
           {&Host::AttrSource, "AttrSource"},
           {&Host::ItemSource, "ItemSource"}}) {
    (*host).*field = obj.attr(name);
  }
  if (last == nullptr) last = new std::shared_ptr<const Host>();
  *last = host;
  last_obj = obj.ptr();
  obj.inc_ref();  // the cached pointer's object lives as long as the process: its id stays
  return host;
}

// Tables built from Python objects are made under the GIL without function-local statics: a
// thread waiting on a static's initialization guard would hold the GIL that the initializing
// thread may need back (a collection running a finalizer can switch threads). Two threads may
// both build one; the first stored wins and the other leaks, once.
const Stdlib& Std() {
  static Stdlib* built = nullptr;
  if (built != nullptr) return *built;
  Stdlib* lib = [] {
    auto* n = new Stdlib();
    n->getline = py::module_::import("linecache").attr("getline");
    n->resolve_name = py::module_::import("importlib.util").attr("resolve_name");
    n->sys_modules = py::module_::import("sys").attr("modules");
    n->builtins = py::module_::import("builtins").attr("__dict__");
    py::module_ op = py::module_::import("operator");
    for (const char* name : {"add",  "and_",      "floordiv", "lshift",   "matmul",  "mul",  "mod",
                             "or_",  "pow",       "rshift",   "sub",      "truediv", "xor",  "iadd",
                             "iand", "ifloordiv", "ilshift",  "imatmul",  "imul",    "imod", "ior",
                             "ipow", "irshift",   "isub",     "itruediv", "ixor"}) {
      n->binary_ops.push_back(op.attr(name));
    }
    for (auto [sym, name] : {std::pair{"<", "lt"},
                             {"<=", "le"},
                             {"==", "eq"},
                             {"!=", "ne"},
                             {">", "gt"},
                             {">=", "ge"}}) {
      n->compare_ops[py::str(sym)] = op.attr(name);
    }
    n->is_ = op.attr("is_");
    n->is_not = op.attr("is_not");
    n->contains = op.attr("contains");
    n->neg = op.attr("neg");
    n->pos = op.attr("pos");
    n->invert = op.attr("invert");
    n->setitem = op.attr("setitem");
    py::module_ opcode = py::module_::import("opcode");
    n->intrinsic1_names = py::hasattr(opcode, "_intrinsic1_descs")
                              ? py::object(opcode.attr("_intrinsic1_descs"))
                              : py::object(py::none());
    return n;
  }();
  if (built == nullptr) built = lib;
  return *built;
}

[[noreturn]] void Raise(const py::object& exc) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

std::string Str(py::handle h) { return py::str(h).cast<std::string>(); }
std::string Repr(py::handle h) { return py::repr(h).cast<std::string>(); }

bool IsNull(py::handle v) { return v.attr("is_null").cast<bool>(); }

py::list ListOf(const std::vector<py::object>& items) {
  py::list out(items.size());
  for (size_t i = 0; i < items.size(); ++i) out[i] = items[i];
  return out;
}

}  // namespace kiln::capture
