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
//
// Exceptions the traced code raises are modelled where the trace knows for certain that they
// are raised: a tracker raises host.TracedException (an Unsupported carrying the tracker of the
// exception object, kiln.variables.exceptions) where Python would raise and its guards make that
// sure (a missing key of a dict whose keys are guarded), and RAISE_VARARGS and RERAISE raise it
// for an exception the frame made. Run() looks the raising instruction up in the frame's
// exception table as CPython's exception_unwind does: covered, the stack is cut to the entry's
// depth, the instruction's offset pushed for a lasti entry, the exception pushed, and the
// handler runs (PUSH_EXC_INFO, CHECK_EXC_MATCH, POP_EXCEPT, RERAISE, `except E as e`'s stores);
// not covered, it leaves Run() for the caller's executor (the CALL that inlined the frame),
// which looks up its own table, and so on. One no traced frame handles is Unsupported as
// before: a graph break at the root's CALL, where eager then raises it for real. A graph break
// never resumes inside a try block or a handler. What is not modelled exactly stays plain
// Unsupported: an exception reaching a `with` block's __exit__ (WITH_EXCEPT_START), exception
// groups, any exception inside a generator (run to its end when it is made), an AttributeError
// out of an attribute of a class with __getattr__ (which CPython would then call).
#ifndef KILN_CAPTURE_EXECUTOR_H_
#define KILN_CAPTURE_EXECUTOR_H_

#include <pybind11/pybind11.h>

namespace kiln::capture {

void RegisterPython(pybind11::module_& m);

}  // namespace kiln::capture

#endif  // KILN_CAPTURE_EXECUTOR_H_
