// The SHAPE guard: relations between the symbolic sizes of a graph's inputs (their ranges, the
// equalities and inequalities the trace relied on), evaluated over sizes, strides and storage
// offsets read from the frame.
#ifndef KILN_GUARDS_GUARD_SHAPE_H_
#define KILN_GUARDS_GUARD_SHAPE_H_

#include <Python.h>

#include <memory>
#include <string>

#include "guards/guard_checks.h"
#include "status.h"

namespace kiln::guards {

// ("shape", sources, bindings, constraints):
//   sources      a tuple of sources (guard_tree.h's forms), each read once per evaluation
//   bindings     a tuple of (source index, kind, dim, name): symbol i is the `dim`th size or
//                stride ("size", "stride"), or the storage offset ("storage_offset"), of the
//                tensor at that source, or the int there ("int"); `name` is how reasons call it
//   constraints  a tuple of (expr, text): each expr must be true; `text` names it in reasons
// An expr is an int, ("sym", i), or (op, expr...) with op one of add, mul (n-ary), pow (an int
// exponent >= 0), floordiv, ceildiv, mod (Python's, by a positive divisor), max, min (n-ary),
// eq, ne, lt, le, gt, ge, and, or (n-ary), not. Arithmetic is on 64-bit ints; an overflow, a
// division by zero or a value that is not what its binding says (not a tensor, a dim past its
// rank) fails the guard.
StatusOr<std::unique_ptr<LeafCheck>> MakeShapeCheck(PyObject* sources, PyObject* bindings,
                                                    PyObject* constraints,
                                                    std::string description);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_SHAPE_H_
