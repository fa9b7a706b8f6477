// The symbolic executor's loop (see executor.h): the opcode table, the instruction loop with its
// graph-break checkpoints, argument binding and inlining of calls, and kiln._C.Translator.
#include <optional>
#include <unordered_map>

#include "capture/executor.h"
#include "capture/translator.h"

namespace kiln::capture {

namespace {

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

// The translator a Python instance holds, or null while pybind11 has not constructed it yet
// (the collector may visit an instance between its allocation and its holder's construction).
Translator* Unwrap(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  py::detail::value_and_holder v_h = inst->get_value_and_holder(nullptr, false);
  if (!v_h || !v_h.holder_constructed()) return nullptr;
  return v_h.value_ptr<Translator>();
}

}  // namespace

// A frame about to run: `func` with its argument slots.
py::object Translator::Root(py::object func, py::object code, py::sequence slots, py::object output,
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
    // Wrapped (and guarded) where the trace first reads it: Local().
    tx->symbolic_locals_[names[i]] = tx->host_->LazyLocal(
        slots[i], tx->host_->LocalSource(i, names[i]), py::bool_(i >= fresh));
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    // A module argument is wrapped first: its identity guard leads the entry's guards, so that
    // another instance of its class is told by that guard failing first (FrameCallback).
    if (tx->host_->wrapped_first(slots[i]).cast<bool>()) tx->Local(names[i]);
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
        {"STORE_GLOBAL", &T::OpStoreGlobal},
        {"LOAD_DEREF", &T::OpLoadDeref},
        {"STORE_DEREF", &T::OpStoreDeref},
        {"DELETE_DEREF", &T::OpDeleteDeref},
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
        {"RERAISE", &T::OpReraise},
        {"PUSH_EXC_INFO", &T::OpPushExcInfo},
        {"POP_EXCEPT", &T::OpPopExcept},
        {"CHECK_EXC_MATCH", &T::OpCheckExcMatch},
        {"WITH_EXCEPT_START", &T::OpWithExceptStart},
        {"KW_NAMES", &T::OpKwNames},
        {"CALL", &T::OpCall},
        {"CALL_FUNCTION_EX", &T::OpCallFunctionEx},
        {"MAKE_FUNCTION", &T::OpMakeFunction},
        {"BEFORE_WITH", &T::OpBeforeWith},
        {"RETURN_GENERATOR", &T::OpReturnGenerator},
        {"YIELD_VALUE", &T::OpYieldValue},
        {"GET_YIELD_FROM_ITER", &T::OpGetYieldFromIter},
        {"SEND", &T::OpSend},
        {"END_SEND", &T::OpEndSend},
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
        {"SET_ADD", &T::OpSetAdd},
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
                          it->second == &T::OpPopJumpIfFalse || it->second == &T::OpPopJumpIfTrue ||
                          it->second == &T::OpJumpIfFalseOrPop ||
                          it->second == &T::OpJumpIfTrueOrPop ||
                          it->second == &T::OpBinarySubscr;
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

// A resume function starts outside every try block and handler: neither the handlers nor the
// exception being handled are rebuilt there. `with` blocks are the exception: a resume function
// reuses the code's exception table, so a `with` open at the break is open there too, its
// __exit__ a stack value like any other (whether the transformed code can rebuild that __exit__
// is kiln.transform.graph_break's to say; kiln._C.with_exits tells it where they are).
bool Translator::CanBreakAt(const Snapshot& s, const Instruction& inst) {
  return s.mutations == host_->mutation_count().cast<long>() && handlers_open_ == 0 &&
         decoded_->WithBlockExits(inst.offset).has_value();
}

bool Translator::Catch(const Instruction& inst, const py::object& traced) {
  if (!generator_items_.is_none()) {
    // A generator runs to its end where it is made: eager's consumer meets its exception only
    // once its iteration gets that far, if ever.
    Unsupported(Str(traced.attr("reason")) + " inside a generator (kiln runs it to its end)");
  }
  const bytecode::ExceptionEntry* entry = decoded_->HandlerAt(inst.offset);
  if (entry == nullptr) return false;
  const int target = decoded_->IndexOf(entry->target);
  if (target < 0 || stack_.size() < static_cast<size_t>(entry->depth)) {
    Unsupported("an exception handler kiln cannot enter");
  }
  stack_.erase(stack_.begin() + entry->depth, stack_.end());
  if (entry->lasti) Push(Constant(py::int_(inst.offset / 2)));  // in code units, as CPython's
  Push(traced.attr("value"));
  kw_names_ = py::none();
  ip_ = target;
  return true;
}

namespace {

// While a translator runs, the output graph's `where` is its Where (the nodes it records carry
// that stack_trace); its caller's again once it returns or raises.
class WhereScope {
 public:
  WhereScope(py::object output, py::object where) : output_(std::move(output)) {
    prior_ = output_.attr("where");
    output_.attr("where") = std::move(where);
  }
  ~WhereScope() {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // an exception on its way out stays as it was
    if (PyObject_SetAttrString(output_.ptr(), "where", prior_.ptr()) < 0) PyErr_Clear();
    PyErr_Restore(type, value, traceback);
  }
  WhereScope(const WhereScope&) = delete;
  WhereScope& operator=(const WhereScope&) = delete;

 private:
  py::object output_, prior_;
};

}  // namespace

py::object Translator::Run() {
  const std::vector<Instruction>& insts = decoded_->instructions;
  const std::array<OpInfo, 256>& ops = OpTable();
  WhereScope where(output_, py::reinterpret_borrow<py::object>(self_).attr("where"));
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
      const bool traced = e.matches(host_->TracedException);
      if (traced && Catch(inst, exc)) continue;
      const bool located = exc.attr("located").cast<bool>();
      if (!located) {
        exc.attr("located") = true;
        py::str where(Where());
        exc.attr("source_line") = where;
        exc.attr("args") = py::make_tuple(py::str(Str(exc.attr("reason")) + "\n" + Str(where)));
        if (traced) exc.attr("value").attr("where") = where;  // where a re-raise says it began
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

bool Translator::Step(const Instruction& inst) {
  return (this->*OpTable()[inst.opcode].handler)(inst);
}

bool Translator::OpUnknown(const Instruction& inst) {
  Unsupported("opcode " + Str(bytecode::OpName(inst.opcode)));
}

bool Translator::OpNop(const Instruction& inst) { return false; }

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
  const bool varargs = flags & CO_VARARGS;
  const bool varkw = flags & CO_VARKEYWORDS;
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
  tx->exc_info_ = exc_info_;
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
  if ((flags & (CO_COROUTINE | CO_ASYNC_GENERATOR)) ||
      (static_cast<bool>(flags & CO_GENERATOR) != generator)) {
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
  const bool generator = code.attr("co_flags").cast<int>() & CO_GENERATOR;
  return RunChild(code, nested.attr("f_globals"), bound, cells, generator);
}

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
      .def_property_readonly("next_opcode", &Translator::NextOpcode)
      .def("where", &Translator::Where)
      .def_readonly("output", &Translator::output_)
      .def_readonly("code", &Translator::code_)
      .def_readonly("symbolic_locals", &Translator::symbolic_locals_)
      // A local's tracker, an argument wrapped on this first read (LazyLocal).
      .def("local", [](Translator& t, py::str name) { return t.Local(name); });
}

}  // namespace kiln::capture
