// How the guard tree's failure reasons name types, values and dtypes, and how a Python error
// raised inside a guard becomes part of a reason instead of propagating.
#ifndef KILN_GUARDS_GUARD_REASONS_H_
#define KILN_GUARDS_GUARD_REASONS_H_

#include <Python.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace kiln::guards {

// A type as failure reasons name it: module-qualified, since tp_name of a class defined in Python
// is only its bare name ("Parameter").
std::string TypeName(PyTypeObject* type);

// Returns repr(obj) as UTF-8, cut to a length a reason can carry, never failing: an error inside
// __repr__ is cleared. Runs no code of the program: an object of a Python class (a tensor
// subclass, a module) is named by its class and address, tuples and lists item by item.
std::string Repr(PyObject* obj);

// Clears the pending Python exception; when `explain` is set, returns it as "Type: message".
// Guards never propagate exceptions: a guard that cannot be evaluated has failed.
std::string TakeError(bool explain);

// "True" or "False", as Python spells them.
const char* Bool(bool b);

// "torch.float32", as Python spells it.
std::string DtypeName(c10::ScalarType dtype);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_REASONS_H_
