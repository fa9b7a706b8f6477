// Status codes to Python exception types, and raising them inside pybind11 bindings.
#include "python_status.h"

#include <pybind11/pybind11.h>

namespace kiln {

PyObject* PythonExceptionType(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return PyExc_ValueError;
    case StatusCode::kWrongType:
      return PyExc_TypeError;
    case StatusCode::kNotFound:
      return PyExc_LookupError;
    case StatusCode::kIOError:
      return PyExc_OSError;
    case StatusCode::kOk:  // Not an error: a caller's bug, reported as one.
    case StatusCode::kRuntimeError:
      break;
  }
  return PyExc_RuntimeError;
}

PyObject* SetPythonError(const Status& status) {
  PyErr_SetString(
      PythonExceptionType(status.code()),
      status.ok() ? "kiln: an error was raised for an OK status" : status.message().c_str());
  return nullptr;
}

void ThrowPython(const Status& status) {
  SetPythonError(status);
  throw pybind11::error_already_set();
}

}  // namespace kiln
