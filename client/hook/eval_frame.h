// The PEP 523 frame hook: per-code caches in co_extra, the thread-local callback, skip rules.
#ifndef KILN_HOOK_EVAL_FRAME_H_
#define KILN_HOOK_EVAL_FRAME_H_

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

// Adds the hook's types and functions to `module`. Returns 0, or -1 with an exception set.
int kiln_hook_init(PyObject* module);

#ifdef __cplusplus
}
#endif

#endif  // KILN_HOOK_EVAL_FRAME_H_
