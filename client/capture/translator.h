// The symbolic executor's internals, private to client/capture: the Translator (one frame's
// executor), what it reads of Python (Host, Stdlib), and the checkpoints a break resumes from.
#ifndef KILN_CAPTURE_TRANSLATOR_H_
#define KILN_CAPTURE_TRANSLATOR_H_

#include <pybind11/pybind11.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "bytecode/instructions.h"

namespace kiln::capture {

namespace py = pybind11;

using bytecode::Decoded;
using bytecode::Instruction;

constexpr int kMaxInlineDepth = 64;

// Everything the executor uses of kiln's Python side, read once from the host object a capture
// hands it (kiln.capture.host.CaptureHost, which names each one): the executor imports nothing
// of kiln's by name.
struct Host {
  py::object Unsupported, TracedException, GraphBreak, Checkpoint;
  py::object VariableTracker, NullVariable, LazyLocal, ConstantVariable, TupleVariable, ListVariable,
      SetVariable, ConstDictVariable, SliceVariable, ListIteratorVariable, CellVariable,
      NestedFunctionVariable, SuperVariable, ExceptionVariable;
  py::object wrap, apply_operator, raise_exception, check_attribute_error, enter_context;
  py::object mark_checkpoint, mutation_count, mutations_of;
  py::object traces_into, is_torch_file, can_split, wrapped_first;
  py::object LocalSource, GlobalSource, ClosureSource, FrameCellSource, ObjectSource, AttrSource,
      ItemSource;

  // The host of `obj`, made once per host object (normally one per process) and kept with it.
  static std::shared_ptr<const Host> Of(const py::object& obj);
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

// The standard library's pieces, read once (host.cpp).
const Stdlib& Std();

// Small conversions every handler uses.
[[noreturn]] void Raise(const py::object& exc);
std::string Str(py::handle h);
std::string Repr(py::handle h);
bool IsNull(py::handle v);
py::list ListOf(const std::vector<py::object>& items);

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

class Translator {
 public:
  // A frame about to run: `func` with its argument slots.
  static py::object Root(py::object func, py::object code, py::sequence slots, py::object output,
                         py::object host, bool may_break);

  py::object Run();
  // The opcode of the instruction after the one running (-1 at the end of the code): a tracker
  // made by a CALL reads what the program does with it next (`with` it, or keep it).
  int NextOpcode() const {
    const auto& insts = decoded_->instructions;
    return ip_ >= 0 && static_cast<size_t>(ip_) < insts.size() ? insts[ip_].opcode : -1;
  }

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
    exc_info_ = host_->NullVariable();
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
    stack_.erase(stack_.end() - n, stack_.end());
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
  // The tracker of local `name` (bound): an argument of the root frame is wrapped, and so
  // guarded, on its first read here (it holds a LazyLocal until then).
  py::object Local(py::handle name);
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
  // Hands the exception `traced` (a TracedException) raised by `inst` to the handler the
  // frame's exception table names for it, as CPython's exception_unwind does; false where none
  // covers `inst` (it leaves the frame, for the caller's executor to look up in turn).
  bool Catch(const Instruction& inst, const py::object& traced);
  // `obj.name` as LOAD_ATTR and its kin read it (see check_attribute_error).
  py::object GetAttr(const py::object& obj, py::handle name);

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
  bool OpStoreGlobal(const Instruction& inst);
  bool OpLoadDeref(const Instruction& inst);
  bool OpStoreDeref(const Instruction& inst);
  bool OpDeleteDeref(const Instruction& inst);
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
  bool OpReraise(const Instruction& inst);
  bool OpPushExcInfo(const Instruction& inst);
  bool OpPopExcept(const Instruction& inst);
  bool OpCheckExcMatch(const Instruction& inst);
  bool OpWithExceptStart(const Instruction& inst);
  bool OpKwNames(const Instruction& inst);
  bool OpCall(const Instruction& inst);
  bool OpCallFunctionEx(const Instruction& inst);
  bool OpMakeFunction(const Instruction& inst);
  bool OpBeforeWith(const Instruction& inst);
  bool OpReturnGenerator(const Instruction& inst);
  bool OpYieldValue(const Instruction& inst);
  bool OpGetYieldFromIter(const Instruction& inst);
  bool OpSend(const Instruction& inst);
  bool OpEndSend(const Instruction& inst);
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
  bool OpSetAdd(const Instruction& inst);
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
  // The exception being handled (sys.exc_info()'s, per thread in CPython: a callee starts with
  // its caller's): a tracker of one the trace raised, or NULL for none the trace knows of (the
  // root frame's caller may be handling one).
  py::object exc_info_;
  int handlers_open_ = 0;  // PUSH_EXC_INFOs not yet matched by POP_EXCEPT

 public:
  // The garbage collector's view (a CellVariable in the locals holds its translator: a cycle).
  int Traverse(visitproc visit, void* arg) const {
    for (const py::object* o :
         {&code_, &f_globals_, &output_, &kw_names_, &generator_items_, &f_builtins_,
          &globals_source_.dict_source, &return_value_, &exc_info_}) {
      Py_VISIT(o->ptr());
    }
    Py_VISIT(symbolic_locals_.ptr());
    Py_VISIT(cells_.ptr());
    for (const py::object& o : stack_) Py_VISIT(o.ptr());
    return 0;
  }
  void Clear() {
    for (py::object* o : {&code_, &f_globals_, &output_, &kw_names_, &generator_items_,
                          &f_builtins_, &globals_source_.dict_source, &return_value_, &exc_info_}) {
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
  bool breakable = false;  // a root frame may break the graph here (a call, a branch, x[i])
};

// The handler of each opcode of the running interpreter (executor.cpp).
const std::array<OpInfo, 256>& OpTable();

}  // namespace kiln::capture

#endif  // KILN_CAPTURE_TRANSLATOR_H_
