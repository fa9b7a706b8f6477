// Parsing a guard's Python tuples (guard_tree.h lists their forms): a source into its accessors,
// a check into a LeafCheck. A malformed tuple is kInvalidArgument, never a Python exception.
#ifndef KILN_GUARDS_GUARD_PARSE_H_
#define KILN_GUARDS_GUARD_PARSE_H_

#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "guards/guard_accessors.h"
#include "guards/guard_checks.h"
#include "status.h"

namespace kiln::guards {

// Appends the accessors of `source` to *path, root first. On error *path may hold some of them.
Status ParseSource(PyObject* source, std::vector<Accessor>* path);

// The check `check` describes. `on_dead` (a callable, or null) is the callback of the weak
// references ("id", obj) checks hold.
StatusOr<std::unique_ptr<LeafCheck>> ParseCheck(PyObject* check, PyObject* on_dead,
                                                std::string description);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_PARSE_H_
