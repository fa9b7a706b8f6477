// The one place where a client Status becomes a Python exception: each StatusCode has one
// exception type, set with the Status's message.
#ifndef KILN_PYTHON_STATUS_H_
#define KILN_PYTHON_STATUS_H_

#include <Python.h>

#include <utility>

#include "status.h"

namespace kiln {

// The Python exception type of `code` (a borrowed reference to a builtin type):
// kInvalidArgument ValueError, kWrongType TypeError, kNotFound LookupError, kIOError OSError,
// kRuntimeError RuntimeError.
PyObject* PythonExceptionType(StatusCode code);

// Sets the Python exception for `status` (not OK) and returns null, as a CPython slot returns.
PyObject* SetPythonError(const Status& status);

// Sets the Python exception for `status` (not OK) and throws pybind11::error_already_set, for
// code inside pybind11 bindings. A set exception, never pybind11's translation of a C++
// exception: with some toolchains (the CPython 3.12 + torch 2.11 host) that translation crashed
// when torch's translators ran first.
[[noreturn]] void ThrowPython(const Status& status);

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) ThrowPython(status);
}

template <typename T>
T ValueOrThrow(StatusOr<T> result) {
  if (!result.ok()) ThrowPython(result.status());
  return std::move(result).value();
}

}  // namespace kiln

#endif  // KILN_PYTHON_STATUS_H_
