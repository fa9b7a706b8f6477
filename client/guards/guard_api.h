// The guard tree as the frame hook sees it: a C interface, so eval_frame.c needs no C++ or torch.
#ifndef KILN_GUARDS_GUARD_API_H_
#define KILN_GUARDS_GUARD_API_H_

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

// Returns the native guard tree held by a kiln._C.GuardManager, or NULL with TypeError set.
// The pointer stays valid while `manager` is alive.
void* kiln_guard_unwrap(PyObject* manager);

// Evaluates every guard of `tree` against a frame about to start: `slots` are its argument slots
// (positional, keyword-only, *args, **kwargs, in co_varnames order), `func` its function object
// (globals, builtins, closure). Returns 1 when all pass, 0 when one fails. Never raises: an
// exception inside an accessor counts as a failure and is cleared.
int kiln_guard_check(void* tree, PyObject* const* slots, Py_ssize_t nslots, PyObject* func);

// 1 while torch.jit traces on this thread (torch._C._get_tracing_state() is not None), else 0.
int kiln_torch_jit_tracing(void);

#ifdef __cplusplus
}
#endif

#endif  // KILN_GUARDS_GUARD_API_H_
