// How the guard tree's failure reasons name types, values and dtypes, and how a Python error
// raised inside a guard becomes part of a reason instead of propagating.
#include "guards/guard_reasons.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>

namespace kiln::guards {
namespace {

// Reprs inside failure reasons are cut to this many characters: a module's repr can be pages.
constexpr size_t kMaxReprChars = 80;

// Returns str(obj) or repr(obj) as UTF-8, never failing: an error inside __repr__ is cleared.
std::string Text(PyObject* obj, bool repr) {
  PyObject* text = repr ? PyObject_Repr(obj) : PyObject_Str(obj);
  const char* utf8 = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
  std::string out;
  if (utf8 == nullptr) {
    PyErr_Clear();
    out = "<" + TypeName(Py_TYPE(obj)) + " object>";
  } else {
    out = utf8;
  }
  Py_XDECREF(text);
  if (out.size() > kMaxReprChars) out = out.substr(0, kMaxReprChars - 3) + "...";
  return out;
}

}  // namespace

std::string TypeName(PyTypeObject* type) {
  if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE)) return type->tp_name;
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(type);
  const char* qualname =
      heap->ht_qualname != nullptr ? PyUnicode_AsUTF8(heap->ht_qualname) : nullptr;
  PyObject* module = PyDict_GetItemString(type->tp_dict, "__module__");  // borrowed
  const char* module_name =
      module != nullptr && PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : nullptr;
  if (qualname == nullptr) {
    PyErr_Clear();
    return type->tp_name;
  }
  if (module_name == nullptr || std::string_view(module_name) == "builtins") {
    PyErr_Clear();
    return qualname;
  }
  return std::string(module_name) + "." + qualname;
}

std::string Repr(PyObject* obj) { return Text(obj, /*repr=*/true); }

std::string TakeError(bool explain) {
  if (!explain) {
    PyErr_Clear();
    return {};
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* exc = PyErr_GetRaisedException();
#else
  PyObject *type, *exc, *traceback;
  PyErr_Fetch(&type, &exc, &traceback);
  PyErr_NormalizeException(&type, &exc, &traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
#endif
  if (exc == nullptr) return "an unknown error";
  std::string out = TypeName(Py_TYPE(exc)) + ": " + Text(exc, /*repr=*/false);
  Py_DECREF(exc);
  return out;
}

const char* Bool(bool b) { return b ? "True" : "False"; }

std::string DtypeName(c10::ScalarType dtype) {
  try {
    return Repr(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
  } catch (const std::exception&) {
    return c10::toString(dtype);
  }
}

}  // namespace kiln::guards
