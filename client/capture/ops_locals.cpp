// Opcode handlers for names: constants, locals, globals, cells and free variables, attributes,
// imports, and the executor's own loads and stores of them (LoadGlobal, LoadDeref, StoreDeref).
#include "capture/translator.h"

namespace kiln::capture {

py::object Translator::LoadGlobal(const py::object& name) {
  py::dict globals = f_globals_;
  // A global the trace assigned (StoreGlobal): what it assigned, replayed after the graph.
  py::object pending = host_->mutations_of(output_).attr("load")(globals, name);
  if (!pending.is_none()) return pending;
  if (globals.contains(name)) {
    py::object source = globals_source_.For(*host_, name);
    const bool guard = !source.is_none();
    return host_->wrap(Self(), globals[name], source, py::arg("guard") = guard);
  }
  py::dict builtins = f_builtins_;
  if (builtins.contains(name)) {
    return host_->wrap(Self(), builtins[name], py::none(), py::arg("guard") = false);
  }
  Unsupported("NameError: name " + Repr(name) + " is not defined");
}

py::object Translator::LoadDeref(const py::object& name) {
  if (cells_.contains(name)) {
    py::object cell = cells_[name];
    if (py::isinstance(cell, host_->CellVariable)) return cell.attr("get")();
    py::tuple entry = cell;
    py::object cell_obj = entry[0];
    // A cell the trace wrote (StoreDeref): what it wrote, replayed after the graph.
    py::object pending = host_->mutations_of(output_).attr("load")(cell_obj, "cell_contents");
    if (!pending.is_none()) return pending;
    PyObject* contents = PyCell_Get(cell_obj.ptr());
    if (contents == nullptr) {
      PyErr_Clear();
      Unsupported("free variable " + Repr(name) + " is empty");
    }
    py::object value = py::reinterpret_steal<py::object>(contents);
    if (root_) return host_->wrap(Self(), value, host_->ClosureSource(entry[1], name));
    py::object source = py::none();
    if (!host_->is_torch_file(code_.attr("co_filename")).cast<bool>()) {
      source = host_->AttrSource(host_->ObjectSource(cell_obj, py::str("cell:" + Str(name))),
                                 "cell_contents");
    }
    const bool guard = !source.is_none();
    return host_->wrap(Self(), value, source, py::arg("guard") = guard);
  }
  if (symbolic_locals_.contains(name)) return Local(name);
  Unsupported("free variable " + Repr(name) + " is not available");
}

void Translator::StoreDeref(const py::object& name, py::object value) {
  if (cells_.contains(name)) {
    py::object cell = cells_[name];
    if (py::isinstance(cell, host_->CellVariable)) {
      if (!root_) {
        cell.attr("set")(value);
        return;
      }
    } else {
      // A real cell from outside the frame (`nonlocal` in the compiled frame or in a function
      // it inlined): a pending store of its contents, which later loads read back and the
      // transformed code replays after the graph. The root frame's own cell is reached there
      // through the frame (each closure of the code has its own); an inlined function's cell is
      // that function's, which its guards pin.
      py::tuple entry = cell;
      py::object source;
      if (root_) {
        source = host_->FrameCellSource(name);
      } else if (!host_->is_torch_file(code_.attr("co_filename")).cast<bool>()) {
        source = host_->ObjectSource(entry[0], py::str("cell:" + Str(name)));
      } else {
        Unsupported("assignment to free variable " + Repr(name) + " of torch's own function");
      }
      host_->mutations_of(output_).attr("store")(entry[0], source, "cell_contents", value);
      return;
    }
  }
  py::tuple cellvars = code_.attr("co_cellvars");
  for (py::handle v : cellvars) {
    if (v.equal(name)) {
      symbolic_locals_[name] = value;
      return;
    }
  }
  Unsupported("assignment to free variable " + Repr(name) + " of an enclosing function");
}

py::object Translator::ClassCellValue() {
  py::str name("__class__");
  if (!cells_.contains(name)) return py::none();
  py::object cell = cells_[name];
  if (py::isinstance(cell, host_->CellVariable)) return AsConstant(cell.attr("get")());
  return py::tuple(cell)[0].attr("cell_contents");
}

py::object Translator::MakeSuper(py::sequence args) {
  if (py::len(args) == 2) return host_->SuperVariable(AsConstant(args[0]), args[1]);
  if (py::len(args) != 0) Unsupported("super() with one argument");
  py::object cls = ClassCellValue();
  py::tuple varnames = code_.attr("co_varnames");
  const bool has_self = code_.attr("co_argcount").cast<int>() > 0;
  if (cls.is_none() || !has_self || !symbolic_locals_.contains(varnames[0])) {
    Unsupported("zero-argument super() outside a method");
  }
  return host_->SuperVariable(cls, Local(varnames[0]));
}

bool Translator::OpLoadConst(const Instruction& inst) {
  Push(Constant(Arg(inst)));
  return false;
}

py::object Translator::Local(py::handle name) {
  py::object value = symbolic_locals_[name];
  if (!py::isinstance(value, host_->LazyLocal)) return value;
  py::object vt = host_->wrap(Self(), value.attr("value"), value.attr("source"));
  if (value.attr("owned").cast<bool>()) vt.attr("owned_by_frame")();  // made for this call
  symbolic_locals_[name] = vt;
  return vt;
}

bool Translator::OpLoadFast(const Instruction& inst) {
  py::handle argval(inst.argval);
  if (!symbolic_locals_.contains(argval)) {
    Unsupported("UnboundLocalError: " + Repr(argval) + " read before assignment");
  }
  Push(Local(argval));
  return false;
}

bool Translator::OpLoadFastAndClear(const Instruction& inst) {
  py::handle argval(inst.argval);
  if (symbolic_locals_.contains(argval)) {
    Push(Local(argval));
    PyDict_DelItem(symbolic_locals_.ptr(), argval.ptr());
  } else {
    Push(host_->NullVariable());
  }
  return false;
}

bool Translator::OpStoreFast(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object value = Pop();
  if (IsNull(value)) {
    if (symbolic_locals_.contains(argval)) PyDict_DelItem(symbolic_locals_.ptr(), argval.ptr());
  } else {
    symbolic_locals_[argval] = value;
  }
  return false;
}

bool Translator::OpDeleteFast(const Instruction& inst) {
  py::handle argval(inst.argval);
  if (symbolic_locals_.contains(argval)) PyDict_DelItem(symbolic_locals_.ptr(), argval.ptr());
  return false;
}

bool Translator::OpLoadGlobal(const Instruction& inst) {
  if (inst.arg & 1) Push(host_->NullVariable());
  Push(LoadGlobal(Arg(inst)));
  return false;
}

// `global name; name = value` in the frame or a function it inlined: a pending store into that
// module's globals dict (its identity is the module's: the entry's guards pin the functions
// that run here, and so their globals), which later loads read back and the transformed code
// replays after the graph with operator.setitem, in the order of the frame's other stores.
bool Translator::OpStoreGlobal(const Instruction& inst) {
  py::object name = Arg(inst);
  py::object value = Pop();
  if (globals_source_.kind == GlobalsSource::kFixed) {
    Unsupported("assignment to global " + Repr(name) + " of torch's own module");
  }
  py::dict globals = f_globals_;
  py::object module_name =
      globals.contains("__name__") ? py::object(globals["__name__"]) : py::object(py::str("?"));
  py::object source = globals_source_.kind == GlobalsSource::kItem
                          ? globals_source_.dict_source
                          : host_->ObjectSource(globals, py::str("G@" + Str(module_name)));
  host_->mutations_of(output_).attr("store")(globals, source, name, value,
                                             py::arg("setter") = Std().setitem);
  return false;
}

bool Translator::OpLoadDeref(const Instruction& inst) {
  Push(LoadDeref(Arg(inst)));
  return false;
}

bool Translator::OpStoreDeref(const Instruction& inst) {
  StoreDeref(Arg(inst), Pop());
  return false;
}

bool Translator::OpDeleteDeref(const Instruction& inst) {
  // `del name` of a cell variable of this code (its value is a local here; a function made
  // over it reads it through CellVariable). A free variable's cell belongs to another frame.
  py::object name = Arg(inst);
  py::tuple cellvars = code_.attr("co_cellvars");
  for (py::handle v : cellvars) {
    if (!v.equal(name) || cells_.contains(name)) continue;
    if (!symbolic_locals_.contains(name)) {
      Unsupported("NameError: " + Repr(name) + " deleted before assignment");
    }
    PyDict_DelItem(symbolic_locals_.ptr(), name.ptr());
    return false;
  }
  Unsupported("del of free variable " + Repr(name) + " of an enclosing function");
}

bool Translator::OpLoadClosure(const Instruction& inst) {
  py::handle argval(inst.argval);
  Push(host_->CellVariable(Self(), argval));
  return false;
}

py::object Translator::GetAttr(const py::object& obj, py::handle name) {
  try {
    return obj.attr("var_getattr")(Self(), name);
  } catch (py::error_already_set& e) {
    if (e.matches(host_->TracedException)) host_->check_attribute_error(obj, e.value());
    throw;
  }
}

bool Translator::OpLoadAttr(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object obj = Pop();
  py::object attr = GetAttr(obj, argval);
  if (PY_VERSION_HEX >= 0x030C0000 && (inst.arg & 1)) Push(host_->NullVariable());
  Push(attr);
  return false;
}

bool Translator::OpLoadSuperAttr(const Instruction& inst) {
  py::handle argval(inst.argval);
  // 3.12: super().name with [super, class, self] below
  py::object self_vt = Pop();
  py::object cls_vt = Pop();
  Pop();  // the global `super`
  py::object attr =
      host_->SuperVariable(AsConstant(cls_vt), self_vt).attr("var_getattr")(Self(), argval);
  if (inst.arg & 1) Push(host_->NullVariable());
  Push(attr);
  return false;
}

bool Translator::OpLoadMethod(const Instruction& inst) {
  py::handle argval(inst.argval);
  // 3.11
  py::object obj = Pop();
  Push(host_->NullVariable());
  Push(GetAttr(obj, argval));
  return false;
}

bool Translator::OpStoreAttr(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object obj = Pop();
  py::object value = Pop();
  obj.attr("store_attr")(Self(), argval, value);
  return false;
}

bool Translator::OpDeleteAttr(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object obj = Pop();
  obj.attr("del_attr")(Self(), argval);
  return false;
}

bool Translator::OpImportName(const Instruction& inst) {
  py::object fromlist = AsConstant(Pop());
  py::object level = AsConstant(Pop());
  py::object name = Arg(inst);
  if (PyObject_IsTrue(level.ptr())) {
    py::dict globals = f_globals_;
    py::object package =
        globals.contains("__package__") ? py::object(globals["__package__"]) : py::none();
    name = Std().resolve_name(py::str(std::string(level.cast<size_t>(), '.') + Str(name)), package);
  }
  py::dict modules = Std().sys_modules;
  if (!modules.contains(name)) {
    Unsupported("import of " + Str(name) + ", not yet imported (importing has effects)");
  }
  py::object module;
  if (PyObject_IsTrue(fromlist.ptr())) {
    module = modules[name];
  } else {
    std::string top = Str(name);
    top = top.substr(0, top.find('.'));
    module = modules[py::str(top)];
  }
  Push(host_->wrap(Self(), module, py::none(), py::arg("guard") = false));
  return false;
}

bool Translator::OpImportFrom(const Instruction& inst) {
  py::handle argval(inst.argval);
  Push(Peek(1).attr("var_getattr")(Self(), argval));
  return false;
}

}  // namespace kiln::capture
