// The symbolic executor: walks a frame's bytecode (decoded by client/bytecode) with a stack of
// variable trackers, one handler per opcode, CPython 3.11 and 3.12. The trackers themselves
// (client/python/kiln/variables) model values and record torch operations into the graph; the
// executor owns the instruction loop, the value stack, the frame's locals and cells, argument
// binding and inlining of user functions, and the checkpoints a graph break resumes from.
//
// Python sees kiln._C.Translator:
//   Translator.root(func, code, slots, output, host, may_break) -> Translator; .run() -> the
//   tracker the frame returns. `host` (kiln.capture.host.CaptureHost) is everything the executor
//   uses of kiln's Python side: it imports nothing of kiln's by name. Anything it cannot model
//   raises host.Unsupported with the user's file and line; in a root frame that may break, at a
//   CALL or a branch, it raises host.GraphBreak instead (the graph so far, the instruction to
//   run in Python, the state to resume with).
// Instructions are dispatched through a table of member functions indexed by opcode, one per
// opcode (Translator::Op*), built from the running interpreter's opcode names. Values are
// asked only what the tracker protocol declares (kiln/variables/base.py).
// The sources: translator.h (the Translator, private to them), executor.cpp (the loop, binding
// and inlining, this binding), host.cpp (what is read of Python), ops_*.cpp (handlers by family).
// Trackers call back: output, symbolic_locals, code, wrap, inline_call, inline_nested,
// inline_generator, make_super, load_deref, store_deref.
#ifndef KILN_CAPTURE_EXECUTOR_H_
#define KILN_CAPTURE_EXECUTOR_H_

#include <pybind11/pybind11.h>

namespace kiln::capture {

void RegisterPython(pybind11::module_& m);

}  // namespace kiln::capture

#endif  // KILN_CAPTURE_EXECUTOR_H_
