// The symbolic executor (see executor.h). Python objects are held through pybind11; every
// handler mirrors what CPython's own handler does to the value stack, with trackers in place of
// values.
#include "capture/executor.h"

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "bytecode/instructions.h"

namespace py = pybind11;

namespace kiln::capture {
namespace {

using bytecode::Decoded;
using bytecode::Instruction;

constexpr int kMaxInlineDepth = 64;
constexpr int kCoVarargs = 0x04;
constexpr int kCoVarkeywords = 0x08;
constexpr int kCoGenerator = 0x20;
constexpr int kCoCoroutine = 0x80;
constexpr int kCoAsyncGenerator = 0x200;

// Everything the executor uses of kiln's Python side, read once from the host object a capture
// hands it (kiln.capture.host.CaptureHost, which names each one): the executor imports nothing
// of kiln's by name.
struct Host {
  py::object Unsupported, GraphBreak, Checkpoint;
  py::object VariableTracker, NullVariable, ConstantVariable, TupleVariable, ListVariable,
      SetVariable, ConstDictVariable, SliceVariable, ListIteratorVariable, CellVariable,
      NestedFunctionVariable, SuperVariable;
  py::object wrap, apply_operator, mark_checkpoint, mutation_count, mutations_of;
  py::object traces_into, is_torch_file, can_split, offset_in_exception_table;
  py::object LocalSource, GlobalSource, ClosureSource, FrameCellSource, ObjectSource, AttrSource,
      ItemSource;

  // The host of `obj`, made once per host object (normally one per process) and kept with it.
  static std::shared_ptr<const Host> Of(const py::object& obj) {
    static std::shared_ptr<const Host>* last = nullptr;  // under the GIL
    static PyObject* last_obj = nullptr;
    if (last != nullptr && last_obj == obj.ptr()) return *last;
    auto host = std::make_shared<Host>();
    for (auto [field, name] : std::initializer_list<std::pair<py::object Host::*, const char*>>{
             {&Host::Unsupported, "Unsupported"},
             {&Host::GraphBreak, "GraphBreak"},
             {&Host::Checkpoint, "Checkpoint"},
             {&Host::VariableTracker, "VariableTracker"},
             {&Host::NullVariable, "NullVariable"},
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
             {&Host::wrap, "wrap"},
             {&Host::apply_operator, "apply_operator"},
             {&Host::mark_checkpoint, "mark_checkpoint"},
             {&Host::mutation_count, "mutation_count"},
             {&Host::mutations_of, "mutations_of"},
             {&Host::traces_into, "traces_into"},
             {&Host::is_torch_file, "is_torch_file"},
             {&Host::can_split, "can_split"},
             {&Host::offset_in_exception_table, "offset_in_exception_table"},
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
};

// What the executor uses of the standard library: CPython's operator functions in the order of
// BINARY_OP's argument and COMPARE_OP's names, import-name resolution, source lines.
struct Stdlib {
  py::object getline, resolve_name, sys_modules, builtins;
  std::vector<py::object> binary_ops;  // dis._nb_ops order
  py::dict compare_ops;
  py::object is_, is_not, contains, neg, pos, invert, setitem;
  py::object intrinsic1_names;  // 3.12: opcode._intrinsic1_descs, else None
};

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

// The state before a breakable instruction, to break the graph at it.
struct Snapshot {
  std::vector<py::object> stack;
  py::dict locals;
  py::object kw_names;
  py::object graph;
  long mutations = 0;
  int lineno = 0;
};

// Where a frame's globals come from, for guards: the root frame's module (GlobalSource), torch's
// own modules (taken as fixed: no source), or another module's dict.
struct GlobalsSource {
  enum Kind { kRoot, kFixed, kItem } kind = kRoot;
  py::object dict_source;

  py::object For(const Host& host, const py::object& name) const {
    switch (kind) {
      case kRoot:
        return host.GlobalSource(name);
      case kFixed:
        return py::none();
      default:
        return host.ItemSource(dict_source, name);
    }
  }
};

GlobalsSource GlobalsSourceFor(const Host& host, const py::object& f_globals,
                               const py::object& root_globals, const py::object& filename) {
  GlobalsSource s;
  if (f_globals.is(root_globals)) return s;
  if (host.is_torch_file(filename).cast<bool>()) {
    s.kind = GlobalsSource::kFixed;
    return s;
  }
  s.kind = GlobalsSource::kItem;
  py::object module_name = py::reinterpret_borrow<py::dict>(f_globals).contains("__name__")
                               ? py::object(f_globals["__name__"])
                               : py::object(py::str("?"));
  s.dict_source = host.ObjectSource(f_globals, py::str("G@" + Str(module_name)));
  return s;
}

class Translator {
 public:
  // A frame about to run: `func` with its argument slots.
  static py::object Root(py::object func, py::object code, py::sequence slots, py::object output,
                         py::object host, bool may_break) {
    py::object root_globals = func.attr("__globals__");
    output.attr("root_globals") = root_globals;
    auto [obj, tx] = Make(Host::Of(host));
    tx->Init(code, root_globals, py::dict(), output, GlobalsSource{}, 0);
    tx->root_ = true;
    tx->may_break_ = may_break && tx->host_->can_split(code).cast<bool>();
    py::tuple names = code.attr("co_varnames");
    const int fresh = code.attr("co_argcount").cast<int>() +
                      code.attr("co_kwonlyargcount").cast<int>();  // *args, **kwargs: per call
    const Py_ssize_t n = py::len(slots);
    for (Py_ssize_t i = 0; i < n; ++i) {
      py::object vt = tx->host_->wrap(obj, slots[i], tx->host_->LocalSource(i, names[i]));
      if (i >= fresh) vt.attr("owned_by_frame")();  // CPython made it for this call
      tx->symbolic_locals_[names[i]] = vt;
    }
    py::object closure = func.attr("__closure__");
    if (!closure.is_none()) {
      py::tuple freevars = code.attr("co_freevars");
      py::tuple cells = closure;
      for (size_t i = 0; i < cells.size() && i < freevars.size(); ++i) {
        tx->cells_[freevars[i]] = py::make_tuple(cells[i], py::int_(i));
      }
    }
    return obj;
  }

  py::object Run();

  py::object InlineCall(py::object fn, py::sequence args, py::dict kwargs, bool generator);
  py::object InlineNested(py::object nested, py::sequence args, py::dict kwargs);
  py::object MakeSuper(py::sequence args);
  py::object LoadDeref(const py::object& name);
  // What free variable `name` of this executor's code refers to: a CellVariable (a cell of an
  // enclosing executor, for a function the frame made) or (cell, index), a real cell of the
  // function's closure; None when it is not a free variable here.
  py::object ClosureCell(const py::object& name) {
    return cells_.contains(name) ? py::object(cells_[name]) : py::object(py::none());
  }
  void StoreDeref(const py::object& name, py::object value);
  std::string Where() const;

  py::object code_, f_globals_, output_;
  py::dict symbolic_locals_;
  py::object kw_names_ = py::none();
  py::object generator_items_ = py::none();
  int lineno_ = 0;
  int depth_ = 0;
  std::vector<py::object> stack_;

 private:
  static std::pair<py::object, Translator*> Make(std::shared_ptr<const Host> host) {
    py::object obj = py::cast(std::make_unique<Translator>());
    Translator* tx = obj.cast<Translator*>();
    tx->self_ = obj.ptr();  // owned by `obj`, which owns this translator
    tx->host_ = std::move(host);
    return {obj, tx};
  }

  void Init(py::object code, py::object f_globals, py::dict locals, py::object output,
            GlobalsSource globals_source, int depth) {
    code_ = std::move(code);
    f_globals_ = std::move(f_globals);
    py::dict globals = f_globals_;
    py::object builtins =
        globals.contains("__builtins__") ? py::object(globals["__builtins__"]) : Std().builtins;
    if (PyModule_Check(builtins.ptr())) builtins = builtins.attr("__dict__");
    f_builtins_ = builtins;
    symbolic_locals_ = std::move(locals);
    output_ = std::move(output);
    globals_source_ = std::move(globals_source);
    depth_ = depth;
    decoded_ = &bytecode::Decode(code_);
    lineno_ = code_.attr("co_firstlineno").cast<int>();
  }

  py::handle Self() const { return self_; }

  [[noreturn]] void Unsupported(const std::string& message) const {
    Raise(host_->Unsupported(message));
  }
  py::object Constant(py::object value) const { return host_->ConstantVariable(std::move(value)); }
  static py::object Arg(const Instruction& inst) {
    return py::reinterpret_borrow<py::object>(inst.argval);
  }

  // -- the stack --------------------------------------------------------------------------------
  void Push(py::object v) { stack_.push_back(std::move(v)); }
  py::object Pop() {
    if (stack_.empty()) throw py::index_error("kiln: value stack underflow");
    py::object v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::vector<py::object> PopN(size_t n) {
    if (stack_.size() < n) throw py::index_error("kiln: value stack underflow");
    std::vector<py::object> items(std::make_move_iterator(stack_.end() - n),
                                  std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return items;
  }
  py::object& Peek(int depth) {  // depth 1 = top of stack
    if (depth < 1 || static_cast<size_t>(depth) > stack_.size()) {
      throw py::index_error("kiln: value stack underflow");
    }
    return stack_[stack_.size() - depth];
  }
  void JumpTo(const Instruction& inst) {
    if (inst.target < 0) throw py::value_error("kiln: jump to no instruction");
    ip_ = inst.target;
  }

  // -- helpers ---------------------------------------------------------------------------------
  py::object Operator(const py::object& fn, std::initializer_list<py::object> args) {
    py::list list;
    for (const py::object& a : args) list.append(a);
    return host_->apply_operator(Self(), fn, list);
  }
  py::object Unpack(const py::object& v) { return v.attr("unpack")(Self()); }
  py::object AsConstant(const py::object& v) { return v.attr("as_python_constant")(); }
  bool Truth(const py::object& v) { return v.attr("truth")(Self()).cast<bool>(); }
  // A default of the function being bound: trackers (functions made in the frame) as they are;
  // a value from a function object is read through `source` (its __defaults__[i] or
  // __kwdefaults__[name]) and guarded there: the function's identity does not pin its
  // defaults (reassigned __defaults__, a mutable default the call mutates).
  py::object WrapDefault(py::handle value, py::object source) {
    if (py::isinstance(value, host_->VariableTracker))
      return py::reinterpret_borrow<py::object>(value);
    const bool guard = !source.is_none();
    return host_->wrap(Self(), value, source, py::arg("guard") = guard);
  }
  py::object LoadGlobal(const py::object& name);

 public:
  py::object Wrap(py::object value, py::object source, bool guard) {
    return host_->wrap(Self(), std::move(value), std::move(source), py::arg("guard") = guard);
  }

 private:
  py::object ClassCellValue();
  // `defaults_source` / `kwdefaults_source`: sources of the function's __defaults__ and
  // __kwdefaults__, or None (defaults that are trackers, or a library's fixed functions).
  py::dict BindCode(const py::object& code, py::sequence args, py::dict kwargs, py::tuple defaults,
                    py::dict kwdefaults, py::object defaults_source = py::none(),
                    py::object kwdefaults_source = py::none());
  py::object RunChild(py::object code, py::object f_globals, py::dict bound, py::dict cells,
                      bool generator);
  Snapshot TakeSnapshot();
  bool CanBreakAt(const Snapshot& s, const Instruction& inst);

  // Runs one instruction; true when the frame returned (its value in return_value_).
  bool Step(const Instruction& inst);

 public:
  // One handler per opcode, named after what it runs (OpTable maps each of the running
  // interpreter's opcode names to one). Each mirrors CPython's own handler on the value stack,
  // with trackers for values; it returns true when the frame returned.
  bool OpUnknown(const Instruction& inst);
  bool OpNop(const Instruction& inst);
  bool OpPushNull(const Instruction& inst);
  bool OpLoadConst(const Instruction& inst);
  bool OpLoadFast(const Instruction& inst);
  bool OpLoadFastAndClear(const Instruction& inst);
  bool OpStoreFast(const Instruction& inst);
  bool OpDeleteFast(const Instruction& inst);
  bool OpLoadGlobal(const Instruction& inst);
  bool OpLoadDeref(const Instruction& inst);
  bool OpStoreDeref(const Instruction& inst);
  bool OpLoadClosure(const Instruction& inst);
  bool OpLoadAttr(const Instruction& inst);
  bool OpLoadSuperAttr(const Instruction& inst);
  bool OpLoadMethod(const Instruction& inst);
  bool OpStoreAttr(const Instruction& inst);
  bool OpDeleteAttr(const Instruction& inst);
  bool OpImportName(const Instruction& inst);
  bool OpImportFrom(const Instruction& inst);
  bool OpLoadAssertionError(const Instruction& inst);
  bool OpRaiseVarargs(const Instruction& inst);
  bool OpKwNames(const Instruction& inst);
  bool OpCall(const Instruction& inst);
  bool OpCallFunctionEx(const Instruction& inst);
  bool OpMakeFunction(const Instruction& inst);
  bool OpBeforeWith(const Instruction& inst);
  bool OpReturnGenerator(const Instruction& inst);
  bool OpYieldValue(const Instruction& inst);
  bool OpReturnValue(const Instruction& inst);
  bool OpReturnConst(const Instruction& inst);
  bool OpPopTop(const Instruction& inst);
  bool OpCopy(const Instruction& inst);
  bool OpSwap(const Instruction& inst);
  bool OpBinaryOp(const Instruction& inst);
  bool OpCompareOp(const Instruction& inst);
  bool OpIsOp(const Instruction& inst);
  bool OpContainsOp(const Instruction& inst);
  bool OpUnaryNegative(const Instruction& inst);
  bool OpUnaryPositive(const Instruction& inst);
  bool OpUnaryInvert(const Instruction& inst);
  bool OpUnaryNot(const Instruction& inst);
  bool OpCallIntrinsic1(const Instruction& inst);
  bool OpBinarySubscr(const Instruction& inst);
  bool OpBinarySlice(const Instruction& inst);
  bool OpStoreSubscr(const Instruction& inst);
  bool OpDeleteSubscr(const Instruction& inst);
  bool OpStoreSlice(const Instruction& inst);
  bool OpBuildTuple(const Instruction& inst);
  bool OpBuildList(const Instruction& inst);
  bool OpBuildSet(const Instruction& inst);
  bool OpBuildMap(const Instruction& inst);
  bool OpBuildConstKeyMap(const Instruction& inst);
  bool OpBuildSlice(const Instruction& inst);
  bool OpBuildString(const Instruction& inst);
  bool OpFormatValue(const Instruction& inst);
  bool OpListAppend(const Instruction& inst);
  bool OpListExtend(const Instruction& inst);
  bool OpListToTuple(const Instruction& inst);
  bool OpSetUpdate(const Instruction& inst);
  bool OpMapAdd(const Instruction& inst);
  bool OpDictUpdate(const Instruction& inst);
  bool OpUnpackSequence(const Instruction& inst);
  bool OpUnpackEx(const Instruction& inst);
  bool OpJump(const Instruction& inst);
  bool OpGetIter(const Instruction& inst);
  bool OpForIter(const Instruction& inst);
  bool OpEndFor(const Instruction& inst);
  bool OpPopJumpIfFalse(const Instruction& inst) { return BranchOn(inst, false, true); }
  bool OpPopJumpIfTrue(const Instruction& inst) { return BranchOn(inst, true, true); }
  bool OpJumpIfFalseOrPop(const Instruction& inst) { return BranchOn(inst, false, false); }
  bool OpJumpIfTrueOrPop(const Instruction& inst) { return BranchOn(inst, true, false); }
  bool OpPopJumpIfNone(const Instruction& inst) { return JumpIfNone(inst, true); }
  bool OpPopJumpIfNotNone(const Instruction& inst) { return JumpIfNone(inst, false); }

 private:
  // Control flow on trace-time constants.
  bool BranchOn(const Instruction& inst, bool wanted, bool pop_always);
  bool JumpIfNone(const Instruction& inst, bool if_none);

  PyObject* self_ = nullptr;
  std::shared_ptr<const Host> host_;
  py::object f_builtins_;
  GlobalsSource globals_source_;
  const Decoded* decoded_ = nullptr;
  int ip_ = 0;
  int current_ = -1;
  bool may_break_ = false;
  bool root_ = false;
  // Free variables: name -> (cell, index in the closure) for the function's own cells, or a
  // CellVariable for a nested function's cell of an enclosing translator.
  py::dict cells_;
  py::object return_value_;

 public:
  // The garbage collector's view (a CellVariable in the locals holds its translator: a cycle).
  int Traverse(visitproc visit, void* arg) const {
    for (const py::object* o : {&code_, &f_globals_, &output_, &kw_names_, &generator_items_,
                                &f_builtins_, &globals_source_.dict_source, &return_value_}) {
      Py_VISIT(o->ptr());
    }
    Py_VISIT(symbolic_locals_.ptr());
    Py_VISIT(cells_.ptr());
    for (const py::object& o : stack_) Py_VISIT(o.ptr());
    return 0;
  }
  void Clear() {
    for (py::object* o : {&code_, &f_globals_, &output_, &kw_names_, &generator_items_,
                          &f_builtins_, &globals_source_.dict_source, &return_value_}) {
      *o = py::object();
    }
    symbolic_locals_ = py::dict();
    cells_ = py::dict();
    stack_.clear();
  }
};

using Handler = bool (Translator::*)(const Instruction&);

struct OpInfo {
  Handler handler = &Translator::OpUnknown;
  bool breakable = false;  // a root frame may break the graph here (a call or a branch)
};

// The handler of each opcode of the running interpreter, by the opcode's name (3.11's and 3.12's;
// a name the running one lacks is never looked up).
const std::array<OpInfo, 256>& OpTable() {
  static const std::array<OpInfo, 256>* built = nullptr;
  if (built != nullptr) return *built;
  auto* table = new std::array<OpInfo, 256>([] {
    using T = Translator;
    const std::unordered_map<std::string, Handler> by_name = {
        {"RESUME", &T::OpNop},
        {"NOP", &T::OpNop},
        {"EXTENDED_ARG", &T::OpNop},
        {"PRECALL", &T::OpNop},
        {"COPY_FREE_VARS", &T::OpNop},
        {"MAKE_CELL", &T::OpNop},
        {"PUSH_NULL", &T::OpPushNull},
        {"LOAD_CONST", &T::OpLoadConst},
        {"LOAD_FAST", &T::OpLoadFast},
        {"LOAD_FAST_CHECK", &T::OpLoadFast},
        {"LOAD_FAST_AND_CLEAR", &T::OpLoadFastAndClear},
        {"STORE_FAST", &T::OpStoreFast},
        {"DELETE_FAST", &T::OpDeleteFast},
        {"LOAD_GLOBAL", &T::OpLoadGlobal},
        {"LOAD_DEREF", &T::OpLoadDeref},
        {"STORE_DEREF", &T::OpStoreDeref},
        {"LOAD_CLOSURE", &T::OpLoadClosure},
        {"LOAD_ATTR", &T::OpLoadAttr},
        {"LOAD_SUPER_ATTR", &T::OpLoadSuperAttr},
        {"LOAD_METHOD", &T::OpLoadMethod},
        {"STORE_ATTR", &T::OpStoreAttr},
        {"DELETE_ATTR", &T::OpDeleteAttr},
        {"IMPORT_NAME", &T::OpImportName},
        {"IMPORT_FROM", &T::OpImportFrom},
        {"LOAD_ASSERTION_ERROR", &T::OpLoadAssertionError},
        {"RAISE_VARARGS", &T::OpRaiseVarargs},
        {"KW_NAMES", &T::OpKwNames},
        {"CALL", &T::OpCall},
        {"CALL_FUNCTION_EX", &T::OpCallFunctionEx},
        {"MAKE_FUNCTION", &T::OpMakeFunction},
        {"BEFORE_WITH", &T::OpBeforeWith},
        {"RETURN_GENERATOR", &T::OpReturnGenerator},
        {"YIELD_VALUE", &T::OpYieldValue},
        {"RETURN_VALUE", &T::OpReturnValue},
        {"RETURN_CONST", &T::OpReturnConst},
        {"POP_TOP", &T::OpPopTop},
        {"COPY", &T::OpCopy},
        {"SWAP", &T::OpSwap},
        {"BINARY_OP", &T::OpBinaryOp},
        {"COMPARE_OP", &T::OpCompareOp},
        {"IS_OP", &T::OpIsOp},
        {"CONTAINS_OP", &T::OpContainsOp},
        {"UNARY_NEGATIVE", &T::OpUnaryNegative},
        {"UNARY_POSITIVE", &T::OpUnaryPositive},
        {"UNARY_INVERT", &T::OpUnaryInvert},
        {"UNARY_NOT", &T::OpUnaryNot},
        {"CALL_INTRINSIC_1", &T::OpCallIntrinsic1},
        {"BINARY_SUBSCR", &T::OpBinarySubscr},
        {"BINARY_SLICE", &T::OpBinarySlice},
        {"STORE_SUBSCR", &T::OpStoreSubscr},
        {"DELETE_SUBSCR", &T::OpDeleteSubscr},
        {"STORE_SLICE", &T::OpStoreSlice},
        {"BUILD_TUPLE", &T::OpBuildTuple},
        {"BUILD_LIST", &T::OpBuildList},
        {"BUILD_SET", &T::OpBuildSet},
        {"BUILD_MAP", &T::OpBuildMap},
        {"BUILD_CONST_KEY_MAP", &T::OpBuildConstKeyMap},
        {"BUILD_SLICE", &T::OpBuildSlice},
        {"BUILD_STRING", &T::OpBuildString},
        {"FORMAT_VALUE", &T::OpFormatValue},
        {"LIST_APPEND", &T::OpListAppend},
        {"LIST_EXTEND", &T::OpListExtend},
        {"LIST_TO_TUPLE", &T::OpListToTuple},
        {"SET_UPDATE", &T::OpSetUpdate},
        {"MAP_ADD", &T::OpMapAdd},
        {"DICT_UPDATE", &T::OpDictUpdate},
        {"DICT_MERGE", &T::OpDictUpdate},
        {"UNPACK_SEQUENCE", &T::OpUnpackSequence},
        {"UNPACK_EX", &T::OpUnpackEx},
        {"POP_JUMP_IF_FALSE", &T::OpPopJumpIfFalse},
        {"POP_JUMP_IF_TRUE", &T::OpPopJumpIfTrue},
        {"POP_JUMP_FORWARD_IF_FALSE", &T::OpPopJumpIfFalse},
        {"POP_JUMP_FORWARD_IF_TRUE", &T::OpPopJumpIfTrue},
        {"POP_JUMP_BACKWARD_IF_FALSE", &T::OpPopJumpIfFalse},
        {"POP_JUMP_BACKWARD_IF_TRUE", &T::OpPopJumpIfTrue},
        {"JUMP_IF_FALSE_OR_POP", &T::OpJumpIfFalseOrPop},
        {"JUMP_IF_TRUE_OR_POP", &T::OpJumpIfTrueOrPop},
        {"POP_JUMP_IF_NONE", &T::OpPopJumpIfNone},
        {"POP_JUMP_IF_NOT_NONE", &T::OpPopJumpIfNotNone},
        {"POP_JUMP_FORWARD_IF_NONE", &T::OpPopJumpIfNone},
        {"POP_JUMP_FORWARD_IF_NOT_NONE", &T::OpPopJumpIfNotNone},
        {"POP_JUMP_BACKWARD_IF_NONE", &T::OpPopJumpIfNone},
        {"POP_JUMP_BACKWARD_IF_NOT_NONE", &T::OpPopJumpIfNotNone},
        {"JUMP_FORWARD", &T::OpJump},
        {"JUMP_BACKWARD", &T::OpJump},
        {"JUMP_BACKWARD_NO_INTERRUPT", &T::OpJump},
        {"JUMP_ABSOLUTE", &T::OpJump},
        {"GET_ITER", &T::OpGetIter},
        {"FOR_ITER", &T::OpForIter},
        {"END_FOR", &T::OpEndFor},
    };
    std::array<OpInfo, 256> t{};
    for (int code = 0; code < 256; ++code) {
      auto it = by_name.find(bytecode::OpName(code).cast<std::string>());
      if (it == by_name.end()) continue;
      t[code].handler = it->second;
      t[code].breakable = it->second == &T::OpCall || it->second == &T::OpCallFunctionEx ||
                          it->second == &T::OpPopJumpIfFalse || it->second == &T::OpPopJumpIfTrue;
    }
    return t;
  }());
  if (built == nullptr) built = table;
  return *built;
}

std::string Translator::Where() const {
  py::object filename = code_.attr("co_filename");
  std::string line = Str(Std().getline(filename, lineno_).attr("strip")());
  std::string op = current_ >= 0 ? Str(bytecode::OpName(decoded_->instructions[current_].opcode))
                                 : std::string("?");
  return "  File \"" + Str(filename) + "\", line " + std::to_string(lineno_) + ", in " +
         Str(code_.attr("co_name")) + " (" + op + ")\n    " + line;
}

Snapshot Translator::TakeSnapshot() {
  Snapshot s;
  s.stack = stack_;
  s.locals = py::dict(symbolic_locals_);
  s.kw_names = kw_names_;
  s.graph = py::make_tuple(output_.attr("checkpoint")(),
                           host_->mutations_of(output_).attr("checkpoint")());
  s.mutations = host_->mutation_count().cast<long>();
  s.lineno = lineno_;
  host_->mark_checkpoint();
  return s;
}

bool Translator::CanBreakAt(const Snapshot& s, const Instruction& inst) {
  return s.mutations == host_->mutation_count().cast<long>() &&
         !host_->offset_in_exception_table(code_, inst.offset).cast<bool>();
}

py::object Translator::Run() {
  const std::vector<Instruction>& insts = decoded_->instructions;
  const std::array<OpInfo, 256>& ops = OpTable();
  while (true) {
    if (ip_ < 0 || static_cast<size_t>(ip_) >= insts.size()) {
      Unsupported("execution ran past the end of the code");
    }
    const Instruction& inst = insts[ip_];
    current_ = ip_;
    ++ip_;
    if (inst.starts_line) lineno_ = inst.starts_line;
    std::optional<Snapshot> snapshot;
    if (may_break_ && ops[inst.opcode].breakable) snapshot = TakeSnapshot();
    try {
      if (Step(inst)) return std::move(return_value_);
    } catch (py::error_already_set& e) {
      if (!e.matches(host_->Unsupported)) throw;
      py::object exc = e.value();
      const bool located = exc.attr("located").cast<bool>();
      if (!located) {
        exc.attr("located") = true;
        py::str where(Where());
        exc.attr("source_line") = where;
        exc.attr("args") = py::make_tuple(py::str(Str(exc.attr("reason")) + "\n" + Str(where)));
      }
      if (snapshot && CanBreakAt(*snapshot, inst)) {
        lineno_ = snapshot->lineno;
        py::object checkpoint = host_->Checkpoint(ListOf(snapshot->stack), snapshot->locals,
                                                  snapshot->kw_names, snapshot->graph);
        Raise(host_->GraphBreak(checkpoint, bytecode::InstructionObject(inst), exc.attr("reason"),
                                Where()));
      }
      throw;
    }
  }
}

py::object Translator::LoadGlobal(const py::object& name) {
  py::dict globals = f_globals_;
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
  if (symbolic_locals_.contains(name)) return symbolic_locals_[name];
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
  return host_->SuperVariable(cls, symbolic_locals_[varnames[0]]);
}

// Maps call arguments to the callee's parameter names, as CPython's call does.
py::dict Translator::BindCode(const py::object& code, py::sequence args_in, py::dict kwargs,
                              py::tuple defaults, py::dict kwdefaults, py::object defaults_source,
                              py::object kwdefaults_source) {
  const int nargs = code.attr("co_argcount").cast<int>();
  const int nkw = code.attr("co_kwonlyargcount").cast<int>();
  const int posonly = code.attr("co_posonlyargcount").cast<int>();
  const int flags = code.attr("co_flags").cast<int>();
  py::tuple names = code.attr("co_varnames");
  const std::string co_name = Str(code.attr("co_name"));
  const bool varargs = flags & kCoVarargs;
  const bool varkw = flags & kCoVarkeywords;
  py::list args(args_in);
  const int given = static_cast<int>(args.size());
  py::dict bound;
  if (given > nargs && !varargs) {
    Unsupported(co_name + "() takes " + std::to_string(nargs) + " positional arguments but " +
                std::to_string(given) + " were given");
  }
  for (int i = 0; i < nargs && i < given; ++i) bound[names[i]] = args[i];
  py::list extra_pos;
  for (int i = nargs; i < given; ++i) extra_pos.append(args[i]);
  py::dict extra_kw;
  auto index_of = [&](py::handle key, int begin, int end) {
    for (int i = begin; i < end; ++i) {
      if (py::reinterpret_borrow<py::object>(key).equal(names[i])) return i;
    }
    return -1;
  };
  for (auto item : kwargs) {
    py::handle key = item.first;
    if (index_of(key, posonly, nargs) >= 0 || index_of(key, nargs, nargs + nkw) >= 0) {
      if (bound.contains(key)) {
        Unsupported(co_name + "() got multiple values for " + Repr(key));
      }
      bound[key] = item.second;
    } else if (varkw) {
      extra_kw[key] = item.second;
    } else {
      Unsupported(co_name + "() got an unexpected keyword argument " + Repr(key));
    }
  }
  const int ndefaults = static_cast<int>(defaults.size());
  for (int i = 0; i < nargs; ++i) {
    if (bound.contains(names[i])) continue;
    const int j = i - (nargs - ndefaults);
    if (j < 0) Unsupported(co_name + "() missing argument " + Repr(names[i]));
    py::object source =
        defaults_source.is_none() ? py::none() : host_->ItemSource(defaults_source, py::int_(j));
    bound[names[i]] = WrapDefault(defaults[j], source);
  }
  for (int i = nargs; i < nargs + nkw; ++i) {
    if (bound.contains(names[i])) continue;
    if (!kwdefaults.contains(names[i])) {
      Unsupported(co_name + "() missing keyword-only argument " + Repr(names[i]));
    }
    py::object source =
        kwdefaults_source.is_none() ? py::none() : host_->ItemSource(kwdefaults_source, names[i]);
    bound[names[i]] = WrapDefault(kwdefaults[names[i]], source);
  }
  int idx = nargs + nkw;
  if (varargs) bound[names[idx++]] = host_->TupleVariable(extra_pos);
  if (varkw) bound[names[idx]] = host_->ConstDictVariable(extra_kw);
  return bound;
}

py::object Translator::RunChild(py::object code, py::object f_globals, py::dict bound,
                                py::dict cells, bool generator) {
  GlobalsSource source =
      GlobalsSourceFor(*host_, f_globals, output_.attr("root_globals"), code.attr("co_filename"));
  auto [obj, tx] = Make(host_);
  tx->Init(code, f_globals, bound, output_, source, depth_ + 1);
  tx->cells_ = cells;
  if (generator) {
    py::list items;
    tx->generator_items_ = items;
    tx->Run();
    return host_->ListIteratorVariable(items);
  }
  return tx->Run();
}

// Inlines `fn(*args, **kwargs)`. With `generator`, `fn` is a generator function run to
// exhaustion: the result is an iterator over what it yielded.
py::object Translator::InlineCall(py::object fn, py::sequence args, py::dict kwargs,
                                  bool generator) {
  py::object code = fn.attr("__code__");
  const int flags = code.attr("co_flags").cast<int>();
  if ((flags & (kCoCoroutine | kCoAsyncGenerator)) ||
      (static_cast<bool>(flags & kCoGenerator) != generator)) {
    Unsupported("call of generator function " + Str(fn.attr("__qualname__")));
  }
  if (depth_ >= kMaxInlineDepth) Unsupported("inlining too deep (recursion?)");
  if (!host_->traces_into(code).cast<bool>()) {
    Unsupported("call of " + Str(fn.attr("__module__")) + "." + Str(fn.attr("__qualname__")) +
                " (kiln calls library code such as logging or numpy, and functions given to "
                "kiln.disable(recursive=False), at a graph break)");
  }
  py::object defaults = fn.attr("__defaults__");
  py::object kwdefaults = fn.attr("__kwdefaults__");
  // A library's functions are fixed; anyone else's defaults are read through the function
  // object itself (which the guards then hold) and guarded.
  py::object defaults_source = py::none();
  py::object kwdefaults_source = py::none();
  if (!host_->is_torch_file(code.attr("co_filename")).cast<bool>()) {
    py::object fn_source =
        host_->ObjectSource(fn, py::str("<function " + Str(fn.attr("__qualname__")) + ">"));
    defaults_source = host_->AttrSource(fn_source, "__defaults__");
    kwdefaults_source = host_->AttrSource(fn_source, "__kwdefaults__");
  }
  py::dict bound = BindCode(
      code, args, kwargs, defaults.is_none() ? py::tuple() : py::tuple(defaults),
      kwdefaults.is_none() ? py::dict() : py::dict(kwdefaults), defaults_source, kwdefaults_source);
  py::dict cells;
  py::object closure = fn.attr("__closure__");
  if (!closure.is_none()) {
    py::tuple freevars = code.attr("co_freevars");
    py::tuple items = closure;
    for (size_t i = 0; i < items.size() && i < freevars.size(); ++i) {
      cells[freevars[i]] = py::make_tuple(items[i], py::int_(i));
    }
  }
  return RunChild(code, fn.attr("__globals__"), bound, cells, generator);
}

py::object Translator::InlineNested(py::object nested, py::sequence args, py::dict kwargs) {
  py::object code = nested.attr("code");
  if (depth_ >= kMaxInlineDepth) Unsupported("inlining too deep (recursion?)");
  py::object defaults_vt = nested.attr("defaults");
  py::object kwdefaults_vt = nested.attr("kwdefaults");
  py::tuple defaults = defaults_vt.is_none() ? py::tuple() : py::tuple(defaults_vt.attr("items"));
  py::dict kwdefaults =
      kwdefaults_vt.is_none() ? py::dict() : py::dict(kwdefaults_vt.attr("items"));
  py::dict bound = BindCode(code, args, kwargs, defaults, kwdefaults);
  py::dict cells;
  py::object closure = nested.attr("closure");
  if (!closure.is_none() && py::len(closure) > 0) {
    py::tuple freevars = code.attr("co_freevars");
    py::list items(closure);
    for (size_t i = 0; i < items.size() && i < freevars.size(); ++i) cells[freevars[i]] = items[i];
  }
  // Generator expressions run to exhaustion at trace time; their consumer (any, all, tuple, a
  // for loop) then sees the items. Only side-effect-free bodies get here: anything else is
  // Unsupported inside the body.
  const bool generator = code.attr("co_flags").cast<int>() & kCoGenerator;
  return RunChild(code, nested.attr("f_globals"), bound, cells, generator);
}

bool Translator::OpUnknown(const Instruction& inst) {
  Unsupported("opcode " + Str(bytecode::OpName(inst.opcode)));
}

bool Translator::OpNop(const Instruction& inst) { return false; }

bool Translator::OpPushNull(const Instruction& inst) {
  Push(host_->NullVariable());
  return false;
}

bool Translator::OpLoadConst(const Instruction& inst) {
  Push(Constant(Arg(inst)));
  return false;
}

bool Translator::OpLoadFast(const Instruction& inst) {
  py::handle argval(inst.argval);
  if (!symbolic_locals_.contains(argval)) {
    Unsupported("UnboundLocalError: " + Repr(argval) + " read before assignment");
  }
  Push(symbolic_locals_[argval]);
  return false;
}

bool Translator::OpLoadFastAndClear(const Instruction& inst) {
  py::handle argval(inst.argval);
  if (symbolic_locals_.contains(argval)) {
    Push(symbolic_locals_[argval]);
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

bool Translator::OpLoadDeref(const Instruction& inst) {
  Push(LoadDeref(Arg(inst)));
  return false;
}

bool Translator::OpStoreDeref(const Instruction& inst) {
  StoreDeref(Arg(inst), Pop());
  return false;
}

bool Translator::OpLoadClosure(const Instruction& inst) {
  py::handle argval(inst.argval);
  Push(host_->CellVariable(Self(), argval));
  return false;
}

bool Translator::OpLoadAttr(const Instruction& inst) {
  py::handle argval(inst.argval);
  py::object obj = Pop();
  py::object attr = obj.attr("var_getattr")(Self(), argval);
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
  Push(obj.attr("var_getattr")(Self(), argval));
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

bool Translator::OpLoadAssertionError(const Instruction& inst) {
  Unsupported("assert failed at trace time");
}

bool Translator::OpRaiseVarargs(const Instruction& inst) {
  Unsupported("raise statement reached at trace time");
}

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

bool Translator::OpReturnValue(const Instruction& inst) {
  return_value_ = Pop();
  return true;
}

bool Translator::OpReturnConst(const Instruction& inst) {
  return_value_ = Constant(Arg(inst));
  return true;
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

bool Translator::OpBinarySubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  Push(obj.attr("getitem")(Self(), index));
  return false;
}

bool Translator::OpBinarySlice(const Instruction& inst) {
  // 3.12
  py::object end = Pop();
  py::object start = Pop();
  py::object obj = Pop();
  Push(obj.attr("getitem")(Self(), host_->SliceVariable(py::make_tuple(start, end))));
  return false;
}

bool Translator::OpStoreSubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  py::object value = Pop();
  obj.attr("setitem")(Self(), index, value);
  return false;
}

bool Translator::OpDeleteSubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  obj.attr("delitem")(Self(), index);
  return false;
}

bool Translator::OpStoreSlice(const Instruction& inst) {
  // 3.12
  py::object end = Pop();
  py::object start = Pop();
  py::object obj = Pop();
  py::object value = Pop();
  obj.attr("setitem")(Self(), host_->SliceVariable(py::make_tuple(start, end)), value);
  return false;
}

bool Translator::OpBuildTuple(const Instruction& inst) {
  Push(host_->TupleVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildList(const Instruction& inst) {
  Push(host_->ListVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildSet(const Instruction& inst) {
  py::set items;
  for (const py::object& item : PopN(inst.arg)) items.add(AsConstant(item));
  Push(host_->SetVariable(items));
  return false;
}

bool Translator::OpBuildMap(const Instruction& inst) {
  std::vector<py::object> items = PopN(static_cast<size_t>(inst.arg) * 2);
  py::dict d;
  for (size_t i = 0; i < items.size(); i += 2) d[AsConstant(items[i])] = items[i + 1];
  Push(host_->ConstDictVariable(d));
  return false;
}

bool Translator::OpBuildConstKeyMap(const Instruction& inst) {
  py::tuple keys(AsConstant(Pop()));
  std::vector<py::object> values = PopN(inst.arg);
  py::dict d;
  for (size_t i = 0; i < values.size() && i < keys.size(); ++i) d[keys[i]] = values[i];
  Push(host_->ConstDictVariable(d));
  return false;
}

bool Translator::OpBuildSlice(const Instruction& inst) {
  Push(host_->SliceVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildString(const Instruction& inst) {
  std::string joined;
  for (const py::object& part : PopN(inst.arg)) joined += Str(AsConstant(part));
  Push(Constant(py::str(joined)));
  return false;
}

bool Translator::OpFormatValue(const Instruction& inst) {
  py::object spec = (inst.arg & 0x04) ? AsConstant(Pop()) : py::object(py::str(""));
  py::object value = AsConstant(Pop());
  switch (inst.arg & 0x03) {
    case 1:
      value = py::str(value);
      break;
    case 2:
      value = py::repr(value);
      break;
    case 3:
      value = py::reinterpret_steal<py::object>(PyObject_ASCII(value.ptr()));
      if (!value) throw py::error_already_set();
      break;
    default:
      break;
  }
  py::object formatted =
      py::reinterpret_steal<py::object>(PyObject_Format(value.ptr(), spec.ptr()));
  if (!formatted) throw py::error_already_set();
  Push(Constant(formatted));
  return false;
}

bool Translator::OpListAppend(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("items").attr("append")(value);
  return false;
}

bool Translator::OpListExtend(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("items").attr("extend")(Unpack(value));
  return false;
}

bool Translator::OpListToTuple(const Instruction& inst) {
  Push(host_->TupleVariable(Unpack(Pop())));
  return false;
}

bool Translator::OpSetUpdate(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("value").attr("update")(AsConstant(value));
  return false;
}

bool Translator::OpMapAdd(const Instruction& inst) {
  py::object value = Pop();
  py::object key = Pop();
  Peek(inst.arg).attr("items")[AsConstant(key)] = value;
  return false;
}

bool Translator::OpDictUpdate(const Instruction& inst) {
  py::object value = Pop();
  py::object target = Peek(inst.arg);
  if (!py::isinstance(value, host_->ConstDictVariable)) Unsupported("dict update from a non-dict");
  target.attr("items").attr("update")(value.attr("items"));
  return false;
}

bool Translator::OpUnpackSequence(const Instruction& inst) {
  py::list items(Unpack(Pop()));
  if (static_cast<int>(items.size()) != inst.arg) {
    Unsupported("unpacking " + std::to_string(items.size()) + " values into " +
                std::to_string(inst.arg));
  }
  for (size_t i = items.size(); i-- > 0;) Push(items[i]);
  return false;
}

bool Translator::OpUnpackEx(const Instruction& inst) {
  py::list items(Unpack(Pop()));
  const size_t before = inst.arg & 0xFF;
  const size_t after = inst.arg >> 8;
  const size_t n = items.size();
  if (n < before + after) Unsupported("not enough values to unpack");
  for (size_t i = n; i-- > n - after;) Push(items[i]);
  py::list middle;
  for (size_t i = before; i < n - after; ++i) middle.append(items[i]);
  Push(host_->ListVariable(middle));
  for (size_t i = before; i-- > 0;) Push(items[i]);
  return false;
}

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

bool Translator::Step(const Instruction& inst) {
  return (this->*OpTable()[inst.opcode].handler)(inst);
}

// The translator a Python instance holds, or null while pybind11 has not constructed it yet
// (the collector may visit an instance between its allocation and its holder's construction).
Translator* Unwrap(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  py::detail::value_and_holder v_h = inst->get_value_and_holder(nullptr, false);
  if (!v_h || !v_h.holder_constructed()) return nullptr;
  return v_h.value_ptr<Translator>();
}

}  // namespace

void RegisterPython(py::module_& m) {
  py::class_<Translator>(
      m, "Translator", "kiln's symbolic executor for one frame (the root) or one inlined call.",
      py::custom_type_setup([](PyHeapTypeObject* heap_type) {
        PyTypeObject* type = &heap_type->ht_type;
        type->tp_flags |= Py_TPFLAGS_HAVE_GC;
        type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
          Py_VISIT(Py_TYPE(self));
          const Translator* tx = Unwrap(self);
          return tx != nullptr ? tx->Traverse(visit, arg) : 0;
        };
        type->tp_clear = [](PyObject* self) -> int {
          if (Translator* tx = Unwrap(self)) tx->Clear();
          return 0;
        };
      }))
      .def_static("root", &Translator::Root, py::arg("func"), py::arg("code"), py::arg("slots"),
                  py::arg("output"), py::arg("host"), py::arg("may_break") = false)
      .def("run", &Translator::Run)
      .def(
          "inline_call",
          [](Translator& tx, py::object fn, py::sequence args, py::dict kwargs,
             py::object /*fn_source*/,
             bool generator) { return tx.InlineCall(fn, args, kwargs, generator); },
          py::arg("fn"), py::arg("args"), py::arg("kwargs"), py::arg("fn_source") = py::none(),
          py::arg("generator") = false)
      .def(
          "inline_generator",
          [](Translator& tx, py::object fn, py::sequence args, py::dict kwargs) {
            // The items a generator function (a class's __iter__) yields, run at trace time.
            return tx.InlineCall(fn, args, kwargs, true).attr("unpack")(py::cast(&tx));
          },
          py::arg("fn"), py::arg("args"), py::arg("kwargs"))
      .def(
          "wrap",
          [](py::object self, py::object value, py::object source, bool guard) {
            // The tracker of a value read from outside the frame, guarded on `source`.
            return self.cast<Translator&>().Wrap(value, source, guard);
          },
          py::arg("value"), py::arg("source") = py::none(), py::arg("guard") = true)
      .def("inline_nested", &Translator::InlineNested)
      .def("make_super", &Translator::MakeSuper)
      .def("load_deref", &Translator::LoadDeref)
      .def("closure_cell", &Translator::ClosureCell, py::arg("name"))
      .def("store_deref", &Translator::StoreDeref)
      .def_readonly("output", &Translator::output_)
      .def_readonly("code", &Translator::code_)
      .def_readonly("symbolic_locals", &Translator::symbolic_locals_);
}

}  // namespace kiln::capture
