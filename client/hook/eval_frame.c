// The PEP 523 frame hook: which frames kiln sees, the per-code cache of compiled entries kept in
// co_extra, guard evaluation on the hot path, and running a transformed code object in place of
// the original frame. CPython 3.11 and 3.12.
//
// Contract with the Python side (kiln/eval_frame.py):
//  * FrameRegion(fn, callback) calls fn with `callback` installed for this thread; callback=None
//    disables capture inside (kiln.disable). Regions nest (kiln.compile of a compiled function
//    unwraps it: the outermost decides). With module_call= (for an nn.Module
//    fn, see module_forward) it calls fn.forward itself when Module.__call__ would do only that.
//  * For a frame it has no passing entry for, the hook calls
//        callback(func, code, slots: tuple)
//    with capture disabled. It returns None (run this frame eagerly), EAGER (run this frame and
//    every frame it calls eagerly, without calling back: its capture is under way elsewhere),
//    (EAGER, after) (the same, then after() once the frame has returned or raised: work that
//    should not compete with this call for the CPU starts when it is over), SKIP (never look at this
//    code again), CACHE_FULL (keep the entries, run misses eagerly from now on: the hook does so
//    itself and does not call back for that code again) or a tuple
//    (guard_manager, transformed_code, info) to add as a new entry and run now. An entry is used
//    only under the callback that made it (one per kiln.compile / kiln.optimize).
//  * A transformed code object takes the frame's argument slots (positional, keyword-only,
//    *args, **kwargs) as plain positional parameters, and has the original's free variables.
#include "hook/eval_frame.h"

#include <internal/pycore_frame.h>
#include <stdbool.h>

#include "guards/guard_api.h"

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030D0000
#error "kiln's frame hook supports CPython 3.11 and 3.12"
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define KILN_FRAME_FUNC(frame) ((PyFunctionObject*)(frame)->f_funcobj)
#else
#define KILN_FRAME_FUNC(frame) ((frame)->f_func)
#endif

// ---------------------------------------------------------------------------------------------
// Per-code state, stored in co_extra.

typedef struct {
  PyObject* guard_manager;  // kiln._C.GuardManager (owned)
  void* guard_tree;         // its native tree, valid while guard_manager lives
  PyObject* code;           // transformed code (owned)
  PyObject* info;           // whatever the Python side wants to keep for inspection (owned)
  PyObject* fn;             // function over `code` for the last globals/closure seen (owned, or NULL)
  PyObject* owner;          // the callback that made the entry; others do not use it (owned)
  uint64_t hits;
} CacheEntry;

enum CodeMode { kModeNormal = 0, kModeSkip = 1, kModeCacheFull = 2 };

typedef struct {
  int mode;
  uint64_t generation;  // bumped whenever entries change; guards may run code that resets them
  Py_ssize_t n;
  Py_ssize_t cap;
  CacheEntry* entries;  // most recently added first is not required; evaluation is in order
} CodeState;

static Py_ssize_t g_extra_index = -1;
static PyObject* g_skip = NULL;        // sentinel: never look at this code again
static PyObject* g_cache_full = NULL;  // sentinel: stop compiling this code
static PyObject* g_eager = NULL;       // sentinel: this call and its callees as CPython runs them

static void entry_clear(CacheEntry* e) {
  Py_CLEAR(e->guard_manager);
  Py_CLEAR(e->code);
  Py_CLEAR(e->info);
  Py_CLEAR(e->fn);
  Py_CLEAR(e->owner);
  e->guard_tree = NULL;
}

static void code_state_free(void* p) {
  CodeState* st = (CodeState*)p;
  if (st == NULL) return;
  for (Py_ssize_t i = 0; i < st->n; i++) entry_clear(&st->entries[i]);
  PyMem_Free(st->entries);
  PyMem_Free(st);
}

static CodeState* code_state_get(PyCodeObject* code) {
  void* p = NULL;
  if (_PyCode_GetExtra((PyObject*)code, g_extra_index, &p) < 0) {
    PyErr_Clear();
    return NULL;
  }
  return (CodeState*)p;
}

static CodeState* code_state_get_or_create(PyCodeObject* code) {
  CodeState* st = code_state_get(code);
  if (st != NULL) return st;
  st = (CodeState*)PyMem_Calloc(1, sizeof(CodeState));
  if (st == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  if (_PyCode_SetExtra((PyObject*)code, g_extra_index, st) < 0) {
    PyMem_Free(st);
    return NULL;
  }
  return st;
}

static int code_state_append(CodeState* st, PyObject* manager, void* tree, PyObject* code,
                             PyObject* info, PyObject* owner) {
  if (st->n == st->cap) {
    Py_ssize_t cap = st->cap ? st->cap * 2 : 4;
    CacheEntry* grown = (CacheEntry*)PyMem_Realloc(st->entries, cap * sizeof(CacheEntry));
    if (grown == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    st->entries = grown;
    st->cap = cap;
  }
  CacheEntry* e = &st->entries[st->n++];
  st->generation++;
  memset(e, 0, sizeof(*e));
  e->guard_manager = Py_NewRef(manager);
  e->guard_tree = tree;
  e->code = Py_NewRef(code);
  e->info = Py_NewRef(info);
  e->owner = Py_NewRef(owner);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The thread's callback and the interpreter-wide hook installation.

static _Thread_local PyObject* tls_callback = NULL;  // owned; NULL = capture off
// The "force_eager" stance, mirrored here for the hot path: set only by the stance's setter
// (kiln/state.py, ProcessState.stance). While set, compiled entries are not used.
static int g_force_eager = 0;
static Py_ssize_t g_active_threads = 0;  // threads with a callback (GIL-protected)

static PyObject* kiln_eval_frame(PyThreadState* tstate, _PyInterpreterFrame* frame, int throw_flag);

// Swaps the thread's callback (steals `cb`, returns the prior one, owned) and keeps the hook
// installed exactly while some thread has one: outside compiled regions CPython runs untouched.
static PyObject* swap_callback(PyObject* cb) {
  PyObject* prior = tls_callback;
  tls_callback = cb;
  Py_ssize_t delta = (cb != NULL) - (prior != NULL);
  if (delta != 0) {
    Py_ssize_t before = g_active_threads;
    g_active_threads += delta;
    PyInterpreterState* interp = PyInterpreterState_Get();
    if (before == 0 && g_active_threads > 0) {
      _PyInterpreterState_SetEvalFrameFunc(interp, kiln_eval_frame);
    } else if (before > 0 && g_active_threads == 0) {
      _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
    }
  }
  return prior;
}

// ---------------------------------------------------------------------------------------------
// Running a frame ourselves.

static Py_ssize_t frame_nslots(PyCodeObject* code) {
  return code->co_argcount + code->co_kwonlyargcount + ((code->co_flags & CO_VARARGS) != 0) +
         ((code->co_flags & CO_VARKEYWORDS) != 0);
}

#if PY_VERSION_HEX >= 0x030C0000
// In 3.12 the evaluator that runs a frame also clears and pops it; a frame we answer without
// running must be released here. Only frames with no frame object reach this (see the caller).
static void release_unrun_frame(PyThreadState* tstate, _PyInterpreterFrame* frame) {
  for (int i = 0; i < frame->stacktop; i++) Py_XDECREF(frame->localsplus[i]);
  frame->stacktop = 0;
  Py_XDECREF(frame->f_locals);
  frame->f_locals = NULL;
  Py_DECREF(frame->f_funcobj);
  Py_DECREF(frame->f_code);
  PyObject** base = (PyObject**)frame;
  _PyStackChunk* chunk = tstate->datastack_chunk;
  if (base == &chunk->data[0]) {
    _PyStackChunk* previous = chunk->previous;
    tstate->datastack_top = &previous->data[previous->top];
    tstate->datastack_chunk = previous;
    tstate->datastack_limit = (PyObject**)(((char*)previous) + previous->size);
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    arena.free(arena.ctx, chunk, chunk->size);
  } else {
    tstate->datastack_top = base;
  }
}
#endif

static PyObject* eval_default(PyThreadState* tstate, _PyInterpreterFrame* frame, int throw_flag) {
  return _PyEval_EvalFrameDefault(tstate, frame, throw_flag);
}

// A function over the entry's transformed code with the frame function's globals and closure
// (a new reference); reused while those stay the same objects. Making one allocates, and an
// allocation may collect garbage, whose weak-reference callbacks may drop entries (see
// py_drop_entry): nothing of `e` is read after that unless the entries are unchanged.
static PyObject* entry_function(CodeState* st, CacheEntry* e, PyFunctionObject* func) {
  PyFunctionObject* fn = (PyFunctionObject*)e->fn;
  if (fn != NULL && fn->func_globals == func->func_globals &&
      fn->func_closure == func->func_closure) {
    return Py_NewRef(e->fn);
  }
  uint64_t generation = st->generation;
  PyObject* code = Py_NewRef(e->code);
  PyObject* made = PyFunction_New(code, func->func_globals);
  Py_DECREF(code);
  if (made == NULL) return NULL;
  if (func->func_closure != NULL && PyFunction_SetClosure(made, func->func_closure) < 0) {
    Py_DECREF(made);
    return NULL;
  }
  if (st->generation == generation) Py_XSETREF(e->fn, Py_NewRef(made));
  return made;
}

static PyObject* run_entry(PyThreadState* tstate, _PyInterpreterFrame* frame, CodeState* st,
                           CacheEntry* e, PyFunctionObject* func, Py_ssize_t nslots) {
  e->hits++;
  PyObject* fn = entry_function(st, e, func);
  PyObject* result = NULL;
  if (fn != NULL) {
    result = PyObject_Vectorcall(fn, frame->localsplus, nslots, NULL);
    Py_DECREF(fn);
  }
#if PY_VERSION_HEX >= 0x030C0000
  release_unrun_frame(tstate, frame);
#else
  (void)tstate;
#endif
  return result;
}

// 1 pass, 0 fail, -1 when the guards' own Python code (a property they read) changed this
// code's entries: the caller must not touch `e` again.
static int guards_pass(CodeState* st, CacheEntry* e, _PyInterpreterFrame* frame,
                       PyFunctionObject* func, Py_ssize_t nslots) {
  uint64_t generation = st->generation;
  PyObject* manager = Py_NewRef(e->guard_manager);
  int ok = kiln_guard_check(e->guard_tree, frame->localsplus, nslots, (PyObject*)func);
  Py_DECREF(manager);
  return st->generation == generation ? ok : -1;
}

// Calls after() with the frame's exception, if any, set aside and restored: its own failure is
// reported as unraisable, never raised in place of the frame's result.
static void run_after(PyObject* after) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* raised = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
#endif
  PyObject* r = PyObject_CallNoArgs(after);
  if (r == NULL) {
    PyErr_WriteUnraisable(after);
  } else {
    Py_DECREF(r);
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(raised);
#else
  PyErr_Restore(type, value, traceback);
#endif
}

static PyObject* kiln_eval_frame(PyThreadState* tstate, _PyInterpreterFrame* frame, int throw_flag) {
  PyObject* callback = tls_callback;
  PyCodeObject* code = frame->f_code;
  // While torch.jit.trace runs, the tracer must see the real ops of every frame: a compiled
  // entry would hand it a graph it cannot record (or constants where parameters are).
  if (callback == NULL || g_force_eager || throw_flag || tstate->tracing > 0 ||
      frame->frame_obj != NULL || kiln_torch_jit_tracing() ||
      frame->owner != FRAME_OWNED_BY_THREAD ||
      (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR))) {
    return eval_default(tstate, frame, throw_flag);
  }
  CodeState* st = code_state_get(code);
  if (st != NULL && st->mode == kModeSkip) return eval_default(tstate, frame, throw_flag);
  PyFunctionObject* func = KILN_FRAME_FUNC(frame);
  if (func == NULL) return eval_default(tstate, frame, throw_flag);
  Py_ssize_t nslots = frame_nslots(code);

  // Guards may touch Python-level attributes (properties); nothing they run is captured.
  tls_callback = NULL;
  if (st != NULL) {
    for (Py_ssize_t i = 0; i < st->n; i++) {
      CacheEntry* e = &st->entries[i];
      if (e->owner != callback) continue;
      int ok = guards_pass(st, e, frame, func, nslots);
      if (ok < 0) break;  // entries changed under us: treat as a miss
      if (ok) {
        tls_callback = callback;
        return run_entry(tstate, frame, st, e, func, nslots);
      }
    }
    if (st->mode == kModeCacheFull) {
      tls_callback = callback;
      return eval_default(tstate, frame, throw_flag);
    }
  }

  // A miss: ask the Python side, with capture off while it works.
  PyObject* slots = PyTuple_New(nslots);
  PyObject* result = NULL;
  if (slots != NULL) {
    for (Py_ssize_t i = 0; i < nslots; i++) {
      PyObject* v = frame->localsplus[i];
      PyTuple_SET_ITEM(slots, i, Py_NewRef(v != NULL ? v : Py_None));
    }
    Py_INCREF(callback);
    result = PyObject_CallFunctionObjArgs(callback, (PyObject*)func, (PyObject*)code, slots, NULL);
    Py_DECREF(callback);
    Py_DECREF(slots);
  }
  tls_callback = callback;
  if (result == NULL) goto fail;
  if (result == Py_None) {
    Py_DECREF(result);
    return eval_default(tstate, frame, throw_flag);
  }
  const bool eager_then = PyTuple_Check(result) && PyTuple_GET_SIZE(result) == 2 &&
                          PyTuple_GET_ITEM(result, 0) == g_eager;
  if (result == g_eager || eager_then) {
    PyObject* after = eager_then ? Py_NewRef(PyTuple_GET_ITEM(result, 1)) : NULL;
    Py_DECREF(result);
    tls_callback = NULL;
    PyObject* out = eval_default(tstate, frame, throw_flag);
    if (after != NULL) {
      run_after(after);  // what it runs is not captured either
      Py_DECREF(after);
    }
    tls_callback = callback;
    return out;
  }
  if (result == g_skip || result == g_cache_full) {
    int mode = result == g_skip ? kModeSkip : kModeCacheFull;
    Py_DECREF(result);
    st = code_state_get_or_create(code);
    if (st == NULL) goto fail;
    st->mode = mode;
    return eval_default(tstate, frame, throw_flag);
  }
  if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 3 ||
      !PyCode_Check(PyTuple_GET_ITEM(result, 1))) {
    PyErr_SetString(PyExc_TypeError,
                    "kiln frame callback must return None, EAGER, (EAGER, after), SKIP, "
                    "CACHE_FULL or (guard_manager, code, info)");
    Py_DECREF(result);
    goto fail;
  }
  void* tree = kiln_guard_unwrap(PyTuple_GET_ITEM(result, 0));
  st = tree != NULL ? code_state_get_or_create(code) : NULL;
  if (st == NULL || code_state_append(st, PyTuple_GET_ITEM(result, 0), tree,
                                      PyTuple_GET_ITEM(result, 1),
                                      PyTuple_GET_ITEM(result, 2), callback) < 0) {
    Py_DECREF(result);
    goto fail;
  }
  Py_DECREF(result);
  return run_entry(tstate, frame, st, &st->entries[st->n - 1], func, nslots);

fail:
#if PY_VERSION_HEX >= 0x030C0000
  release_unrun_frame(tstate, frame);
#endif
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// FrameRegion: a callable that runs its target with a callback installed (or capture disabled).

typedef struct {
  PyObject_HEAD
  PyObject* fn;
  PyObject* callback;  // NULL = disable capture
  // For an nn.Module fn: what torch.nn.Module.__call__ consults (see module_forward), or NULL.
  PyObject* module_call;
  PyObject* dict;
  PyObject* weakreflist;
  vectorcallfunc vectorcall;
} FrameRegion;

// The fields of module_call, a tuple made by kiln/eval_frame.py from torch.nn.Module.
enum {
  kModuleCallFn,       // torch.nn.Module.__call__ (_wrapped_call_impl)
  kModuleCallImpl,     // torch.nn.Module._call_impl, which __call__ looks up on the instance
  kModuleGlobalHooks,  // tuple of torch.nn.modules.module's four global hook dicts
  kModuleCallFields
};

static PyObject* g_str_call = NULL;       // "__call__"
static PyObject* g_str_call_impl = NULL;  // "_call_impl"
static PyObject* g_str_forward = NULL;    // "forward"
static PyObject* g_module_fields[5];      // instance attributes that must be empty / None

// True when the instance attribute `name`, read from the instance's `dict`, is an empty dict.
static int empty_dict_attr(PyObject* dict, PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(dict, name);
  return v != NULL && PyDict_Check(v) && PyDict_GET_SIZE(v) == 0;
}

// When calling the module would only call its forward: torch.nn.Module.__call__ and _call_impl
// (neither overridden), with no _compiled_call_impl, no JIT tracing and no hooks (the module's
// four hook dicts and the four global ones all empty), go straight to
// self.forward(*args, **kwargs). Then this returns that bound forward (new reference) and the
// call skips Module.__call__'s two Python frames and the argument tuples and dicts they build
// (a third of a small graph's call); otherwise NULL with no error set, and the module is called
// as it is. Every condition is read at each call: a hook registered later is honoured.
static PyObject* module_forward(FrameRegion* r) {
  PyObject* mod = r->fn;
  PyObject* call = _PyType_Lookup(Py_TYPE(mod), g_str_call);
  if (call == NULL || call != PyTuple_GET_ITEM(r->module_call, kModuleCallFn)) return NULL;
  PyObject** dictptr = _PyObject_GetDictPtr(mod);
  PyObject* dict = dictptr != NULL ? *dictptr : NULL;
  if (dict == NULL || !PyDict_Check(dict)) return NULL;
  // A class (or instance) with its own _call_impl changes what __call__ does.
  if (_PyType_Lookup(Py_TYPE(mod), g_str_call_impl) !=
          PyTuple_GET_ITEM(r->module_call, kModuleCallImpl) ||
      PyDict_GetItemWithError(dict, g_str_call_impl) != NULL) {
    goto slow;
  }
  // Module.compile() sets it on the instance; the class attribute is None.
  PyObject* compiled = PyDict_GetItemWithError(dict, g_module_fields[0]);
  if (compiled == NULL && !PyErr_Occurred()) {
    compiled = _PyType_Lookup(Py_TYPE(mod), g_module_fields[0]);
  }
  if (compiled != Py_None) goto slow;
  for (int i = 1; i < 5; i++) {
    if (!empty_dict_attr(dict, g_module_fields[i])) goto slow;
  }
  PyObject* globals = PyTuple_GET_ITEM(r->module_call, kModuleGlobalHooks);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(globals); i++) {
    PyObject* d = PyTuple_GET_ITEM(globals, i);
    if (!PyDict_Check(d) || PyDict_GET_SIZE(d) != 0) goto slow;
  }
  if (kiln_torch_jit_tracing()) return NULL;
  PyObject* forward = PyObject_GetAttr(mod, g_str_forward);
  if (forward == NULL) goto slow;
  return forward;
slow:
  PyErr_Clear();  // whatever went wrong, Module.__call__ meets it again and reports it
  return NULL;
}

static PyObject* region_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                                   PyObject* kwnames) {
  FrameRegion* r = (FrameRegion*)self;
  PyObject* prior = swap_callback(Py_XNewRef(r->callback));
  PyObject* result;
  PyObject* forward = r->module_call != NULL ? module_forward(r) : NULL;
  if (forward != NULL) {
    result = PyObject_Vectorcall(forward, args, nargsf, kwnames);
    Py_DECREF(forward);
  } else {
    result = PyObject_Vectorcall(r->fn, args, nargsf, kwnames);
  }
  Py_XDECREF(swap_callback(prior));
  return result;
}

static PyObject* region_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* fn = NULL;
  PyObject* callback = Py_None;
  PyObject* module_call = Py_None;
  static char* kwlist[] = {"fn", "callback", "module_call", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:FrameRegion", kwlist, &fn, &callback,
                                   &module_call)) {
    return NULL;
  }
  if (!PyCallable_Check(fn) || (callback != Py_None && !PyCallable_Check(callback))) {
    PyErr_SetString(PyExc_TypeError, "FrameRegion(fn, callback): both must be callable");
    return NULL;
  }
  if (module_call != Py_None &&
      (!PyTuple_Check(module_call) || PyTuple_GET_SIZE(module_call) != kModuleCallFields ||
       !PyTuple_Check(PyTuple_GET_ITEM(module_call, kModuleGlobalHooks)))) {
    PyErr_SetString(PyExc_TypeError,
                    "FrameRegion: module_call must be (Module.__call__, Module._call_impl, "
                    "global hook dicts)");
    return NULL;
  }
  FrameRegion* r = (FrameRegion*)type->tp_alloc(type, 0);
  if (r == NULL) return NULL;
  r->fn = Py_NewRef(fn);
  r->callback = callback == Py_None ? NULL : Py_NewRef(callback);
  r->module_call = module_call == Py_None ? NULL : Py_NewRef(module_call);
  r->vectorcall = region_vectorcall;
  return (PyObject*)r;
}

static int region_traverse(FrameRegion* r, visitproc visit, void* arg) {
  Py_VISIT(r->fn);
  Py_VISIT(r->callback);
  Py_VISIT(r->module_call);
  Py_VISIT(r->dict);
  return 0;
}

static int region_clear(FrameRegion* r) {
  Py_CLEAR(r->fn);
  Py_CLEAR(r->callback);
  Py_CLEAR(r->module_call);
  Py_CLEAR(r->dict);
  return 0;
}

static void region_dealloc(FrameRegion* r) {
  PyObject_GC_UnTrack(r);
  if (r->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject*)r);
  region_clear(r);
  Py_TYPE(r)->tp_free((PyObject*)r);
}

static PyObject* region_descr_get(PyObject* self, PyObject* obj, PyObject* type) {
  (void)type;
  if (obj == NULL || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

static PyObject* region_get_fn(FrameRegion* r, void* closure) {
  (void)closure;
  return Py_NewRef(r->fn);
}

static PyObject* region_get_callback(FrameRegion* r, void* closure) {
  (void)closure;
  return Py_NewRef(r->callback != NULL ? r->callback : Py_None);
}

static PyGetSetDef region_getset[] = {
    {"fn", (getter)region_get_fn, NULL, "the wrapped callable", NULL},
    {"callback", (getter)region_get_callback, NULL, "the frame callback (None: disabled)", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrameRegionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.FrameRegion",
    .tp_basicsize = sizeof(FrameRegion),
    .tp_dealloc = (destructor)region_dealloc,
    .tp_vectorcall_offset = offsetof(FrameRegion, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "FrameRegion(fn, callback=None): call fn with kiln's frame callback installed "
              "(None disables capture) for this thread.",
    .tp_traverse = (traverseproc)region_traverse,
    .tp_clear = (inquiry)region_clear,
    .tp_weaklistoffset = offsetof(FrameRegion, weakreflist),
    .tp_getset = region_getset,
    .tp_descr_get = region_descr_get,
    .tp_dictoffset = offsetof(FrameRegion, dict),
    .tp_new = region_new,
};

// ---------------------------------------------------------------------------------------------
// Module functions.

static PyObject* py_set_eval_frame(PyObject* self, PyObject* callback) {
  (void)self;
  if (callback != Py_None && !PyCallable_Check(callback)) {
    PyErr_SetString(PyExc_TypeError, "set_eval_frame: callback must be callable or None");
    return NULL;
  }
  PyObject* prior = swap_callback(callback == Py_None ? NULL : Py_NewRef(callback));
  return prior != NULL ? prior : Py_NewRef(Py_None);
}

static PyObject* py_get_eval_frame(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return Py_NewRef(tls_callback != NULL ? tls_callback : Py_None);
}

static PyObject* py_cache_entries(PyObject* self, PyObject* code) {
  (void)self;
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "cache_entries(code): expected a code object");
    return NULL;
  }
  CodeState* st = code_state_get((PyCodeObject*)code);
  if (st == NULL || st->n == 0) return PyList_New(0);
  // The entries are copied out (with references) before anything allocates a Python object:
  // an allocation may collect garbage and drop entries.
  Py_ssize_t n = st->n;
  CacheEntry* copy = (CacheEntry*)PyMem_Malloc(n * sizeof(CacheEntry));
  if (copy == NULL) return PyErr_NoMemory();
  for (Py_ssize_t i = 0; i < n; i++) {
    copy[i] = st->entries[i];
    Py_INCREF(copy[i].guard_manager);
    Py_INCREF(copy[i].code);
    Py_INCREF(copy[i].info);
  }
  PyObject* list = PyList_New(n);
  for (Py_ssize_t i = 0; i < n && list != NULL; i++) {
    PyObject* item = Py_BuildValue("(OOOK)", copy[i].guard_manager, copy[i].code, copy[i].info,
                                   (unsigned long long)copy[i].hits);
    if (item == NULL) Py_CLEAR(list);
    else PyList_SET_ITEM(list, i, item);
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_DECREF(copy[i].guard_manager);
    Py_DECREF(copy[i].code);
    Py_DECREF(copy[i].info);
  }
  PyMem_Free(copy);
  return list;
}

// Drops the entry of `code` whose guard manager is `manager`, if it is there. Called from the
// weak-reference callback of a guard whose object died: at any moment, garbage collection
// included, so the entry is detached first and released after.
static PyObject* py_drop_entry(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* code;
  PyObject* manager;
  if (!PyArg_ParseTuple(args, "O!O:drop_entry", &PyCode_Type, &code, &manager)) return NULL;
  CodeState* st = code_state_get((PyCodeObject*)code);
  if (st == NULL) Py_RETURN_FALSE;
  for (Py_ssize_t i = 0; i < st->n; i++) {
    if (st->entries[i].guard_manager != manager) continue;
    CacheEntry dropped = st->entries[i];
    memmove(&st->entries[i], &st->entries[i + 1], (st->n - i - 1) * sizeof(CacheEntry));
    st->n--;
    st->generation++;
    entry_clear(&dropped);
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

static PyObject* py_code_mode(PyObject* self, PyObject* code) {
  (void)self;
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "code_mode(code): expected a code object");
    return NULL;
  }
  CodeState* st = code_state_get((PyCodeObject*)code);
  static const char* names[] = {"normal", "skip", "cache_full"};
  return PyUnicode_FromString(st == NULL ? "unseen" : names[st->mode]);
}

static PyObject* py_mark_skip(PyObject* self, PyObject* code) {
  (void)self;
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "mark_skip(code): expected a code object");
    return NULL;
  }
  CodeState* st = code_state_get_or_create((PyCodeObject*)code);
  if (st == NULL) return NULL;
  st->mode = kModeSkip;
  Py_RETURN_NONE;
}

// Drops every entry of `code` and returns it to the unseen state (kiln.reset()).
static PyObject* py_reset_code(PyObject* self, PyObject* code) {
  (void)self;
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "reset_code(code): expected a code object");
    return NULL;
  }
  CodeState* st = code_state_get((PyCodeObject*)code);
  if (st != NULL) {
    // Entries are detached before they are released: releasing may run arbitrary code.
    CacheEntry* entries = st->entries;
    Py_ssize_t n = st->n;
    st->entries = NULL;
    st->n = st->cap = 0;
    st->mode = kModeNormal;
    st->generation++;
    for (Py_ssize_t i = 0; i < n; i++) entry_clear(&entries[i]);
    PyMem_Free(entries);
  }
  Py_RETURN_NONE;
}

static PyObject* py_set_force_eager(PyObject* self, PyObject* flag) {
  (void)self;
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  g_force_eager = on;
  Py_RETURN_NONE;
}

static PyMethodDef hook_methods[] = {
    {"set_force_eager", py_set_force_eager, METH_O,
     "set_force_eager(bool): while set, the hook runs every frame as CPython would"},
    {"set_eval_frame", py_set_eval_frame, METH_O,
     "set_eval_frame(callback_or_None) -> prior: install this thread's frame callback"},
    {"get_eval_frame", py_get_eval_frame, METH_NOARGS, "this thread's frame callback, or None"},
    {"cache_entries", py_cache_entries, METH_O,
     "cache_entries(code) -> [(guard_manager, transformed_code, info, hits)]"},
    {"code_mode", py_code_mode, METH_O, "code_mode(code) -> 'unseen'|'normal'|'skip'|'cache_full'"},
    {"mark_skip", py_mark_skip, METH_O, "mark_skip(code): the hook never looks at code again"},
    {"reset_code", py_reset_code, METH_O, "reset_code(code): drop its entries and its mode"},
    {"drop_entry", py_drop_entry, METH_VARARGS,
     "drop_entry(code, guard_manager) -> bool: drop that entry of code's, if it is there"},
    {NULL, NULL, 0, NULL},
};

int kiln_hook_init(PyObject* module) {
  if (g_extra_index < 0) {
    g_extra_index = _PyEval_RequestCodeExtraIndex(code_state_free);
    if (g_extra_index < 0) {
      PyErr_SetString(PyExc_RuntimeError, "kiln: no co_extra index available");
      return -1;
    }
  }
  if (PyType_Ready(&FrameRegionType) < 0) return -1;
  if (PyModule_AddObjectRef(module, "FrameRegion", (PyObject*)&FrameRegionType) < 0) return -1;
  if (g_skip == NULL) {
    g_skip = PyUnicode_InternFromString("kiln.SKIP");
    g_cache_full = PyUnicode_InternFromString("kiln.CACHE_FULL");
    g_eager = PyUnicode_InternFromString("kiln.EAGER");
    if (g_skip == NULL || g_cache_full == NULL || g_eager == NULL) return -1;
  }
  if (g_str_call == NULL) {
    static const char* fields[5] = {"_compiled_call_impl", "_backward_hooks",
                                    "_backward_pre_hooks", "_forward_hooks",
                                    "_forward_pre_hooks"};
    for (int i = 0; i < 5; i++) {
      g_module_fields[i] = PyUnicode_InternFromString(fields[i]);
      if (g_module_fields[i] == NULL) return -1;
    }
    g_str_call = PyUnicode_InternFromString("__call__");
    g_str_forward = PyUnicode_InternFromString("forward");
    g_str_call_impl = PyUnicode_InternFromString("_call_impl");
    if (g_str_call == NULL || g_str_forward == NULL || g_str_call_impl == NULL) return -1;
  }
  if (PyModule_AddObjectRef(module, "SKIP", g_skip) < 0) return -1;
  if (PyModule_AddObjectRef(module, "CACHE_FULL", g_cache_full) < 0) return -1;
  if (PyModule_AddObjectRef(module, "EAGER", g_eager) < 0) return -1;
  return PyModule_AddFunctions(module, hook_methods);
}
