// How the guard tree's failure reasons name types, values and dtypes, and how a Python error
// raised inside a guard becomes part of a reason instead of propagating.
#include "guards/guard_reasons.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>

#include <cstddef>
#include <cstdio>
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

// Depth to which tuples and lists are spelled out inside a reason.
constexpr int kMaxReprDepth = 3;

std::string SafeRepr(PyObject* obj, int depth) {
  PyTypeObject* type = Py_TYPE(obj);
  if (type == &PyTuple_Type || type == &PyList_Type) {
    const bool tuple = type == &PyTuple_Type;
    if (depth >= kMaxReprDepth) return tuple ? "(...)" : "[...]";
    const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
    std::string out = tuple ? "(" : "[";
    for (Py_ssize_t i = 0; i < n && out.size() < kMaxReprChars; ++i) {
      if (i) out += ", ";
      PyObject* item = tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i);
      Py_INCREF(item);  // a list item could go away while the rest is spelled
      out += SafeRepr(item, depth + 1);
      Py_DECREF(item);
    }
    if (tuple && n == 1) out += ",";
    out += tuple ? ")" : "]";
    return out;
  }
  // A class's repr, and a C type's own, run no code of the program; a Python class's __repr__
  // (a tensor subclass's goes through its __torch_function__) and a container's repr of its
  // items could: explaining a guard must not change what the program sees.
  const bool c_repr = !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) && type != &PyDict_Type &&
                      type != &PySet_Type && type != &PyFrozenSet_Type;
  if (PyType_Check(obj)) {
    return "<class '" + TypeName(reinterpret_cast<PyTypeObject*>(obj)) + "'>";
  }
  if (!c_repr) {
    char address[32];
    std::snprintf(address, sizeof(address), "%p", static_cast<void*>(obj));
    return "<" + TypeName(type) + " object at " + address + ">";
  }
  return Text(obj, /*repr=*/true);
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

std::string Repr(PyObject* obj) {
  std::string out = SafeRepr(obj, 0);
  if (out.size() > kMaxReprChars) out = out.substr(0, kMaxReprChars - 3) + "...";
  return out;
}

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
