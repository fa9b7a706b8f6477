// Sources, one step at a time: an Accessor reads one step of a guard's source (an argument slot,
// a global, an attribute, an item...) from its parent value, and ReadPath a whole source.
#include "guards/guard_accessors.h"

#include <string>
#include <vector>

#include "guards/guard_reasons.h"

namespace kiln::guards {

Accessor::Accessor(Access kind, Py_ssize_t index, PyObject* arg)
    : kind_(kind), index_(index), arg_(arg) {
  // An exact-int key of a list or tuple is read by index, without PyObject_GetItem.
  if (kind == Access::kItem && PyLong_CheckExact(arg)) {
    int overflow = 0;
    long long key = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow == 0 && key >= PY_SSIZE_T_MIN && key <= PY_SSIZE_T_MAX) {
      index_ = static_cast<Py_ssize_t>(key);
      int_key_ = true;
    }
  }
}

bool Accessor::SameAs(const Accessor& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Access::kRoot:
    case Access::kInstanceDict:
    case Access::kType:
    case Access::kWeakRef:
      return true;
    case Access::kLocal:
    case Access::kClosure:
      return index_ == other.index_;
    case Access::kObject:
      return arg_ == other.arg_;
    case Access::kGlobal:
    case Access::kBuiltin:
    case Access::kAttr:
    case Access::kItem:
    case Access::kDictItem: {
      // 1, 1.0 and True are equal keys of a dict but different items of other mappings.
      if (arg_ == other.arg_) return true;
      if (Py_TYPE(arg_) != Py_TYPE(other.arg_)) return false;
      int eq = PyObject_RichCompareBool(arg_, other.arg_, Py_EQ);
      if (eq < 0) PyErr_Clear();
      return eq == 1;
    }
  }
  return false;
}

PyObject* Accessor::Read(PyObject* parent, const Frame& frame, std::string* why) const {
  switch (kind_) {
    case Access::kRoot:
      return nullptr;
    case Access::kLocal: {
      if (index_ >= frame.nslots) {
        if (why) {
          *why = "argument slot " + std::to_string(index_) + " is out of range (the frame has " +
                 std::to_string(frame.nslots) + ")";
        }
        return nullptr;
      }
      PyObject* value = frame.slots[index_];
      if (value == nullptr && why) *why = "argument slot " + std::to_string(index_) + " is empty";
      return Py_XNewRef(value);
    }
    case Access::kGlobal:
    case Access::kBuiltin: {
      if (frame.func == nullptr) {
        if (why) *why = "no function object to read " + Name() + " from";
        return nullptr;
      }
      PyObject* dict =
          kind_ == Access::kGlobal ? frame.func->func_globals : frame.func->func_builtins;
      return ReadKey(dict, why);
    }
    case Access::kClosure: {
      PyObject* closure = frame.func != nullptr ? frame.func->func_closure : nullptr;
      if (closure == nullptr || !PyTuple_Check(closure) || index_ >= PyTuple_GET_SIZE(closure)) {
        if (why) *why = Name() + " does not exist";
        return nullptr;
      }
      PyObject* cell = PyTuple_GET_ITEM(closure, index_);
      PyObject* value = PyCell_Check(cell) ? PyCell_GET(cell) : nullptr;
      if (value == nullptr && why) *why = Name() + " is empty";
      return Py_XNewRef(value);
    }
    case Access::kObject:
      return Py_NewRef(arg_);
    case Access::kAttr: {
      PyObject* value = PyObject_GetAttr(parent, arg_);
      if (value == nullptr) Failed(why);
      return value;
    }
    case Access::kInstanceDict: {
      // The object's own dict slot, bypassing a __dict__ descriptor; creates it when absent.
      PyObject* value = PyObject_GenericGetDict(parent, nullptr);
      if (value == nullptr) Failed(why);
      return value;
    }
    case Access::kItem:
      if (int_key_ && (PyList_CheckExact(parent) || PyTuple_CheckExact(parent))) {
        Py_ssize_t size = Py_SIZE(parent);
        Py_ssize_t i = index_ < 0 ? index_ + size : index_;
        if (i < 0 || i >= size) {
          if (why) *why = Name() + " is out of range (length " + std::to_string(size) + ")";
          return nullptr;
        }
        return Py_NewRef(PyList_CheckExact(parent) ? PyList_GET_ITEM(parent, i)
                                                   : PyTuple_GET_ITEM(parent, i));
      }
      return ReadKey(parent, why);
    case Access::kDictItem: {
      if (!PyDict_Check(parent)) {
        if (why) *why = Name() + ": expected a dict, got " + TypeName(Py_TYPE(parent));
        return nullptr;
      }
      return ReadKey(parent, why);  // the storage: never a subclass's __getitem__
    }
    case Access::kType:
      return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(parent)));
    case Access::kWeakRef:
      // Only weakref.ref itself: a subclass may override __call__.
      if (!PyWeakref_CheckRefExact(parent)) {
        if (why) *why = Name() + ": expected a weakref.ref, got " + TypeName(Py_TYPE(parent));
        return nullptr;
      }
      return Py_NewRef(PyWeakref_GetObject(parent));
  }
  return nullptr;
}

std::string Accessor::Name() const {
  switch (kind_) {
    case Access::kRoot:
      return "the frame";
    case Access::kLocal:
      return "argument slot " + std::to_string(index_);
    case Access::kGlobal:
      return "global " + Repr(arg_);
    case Access::kBuiltin:
      return "builtin " + Repr(arg_);
    case Access::kClosure:
      return "closure cell " + std::to_string(index_);
    case Access::kObject:
      return Repr(arg_);
    case Access::kAttr:
      return "attribute " + Repr(arg_);
    case Access::kInstanceDict:
      return "__dict__";
    case Access::kItem:
      return "item [" + Repr(arg_) + "]";
    case Access::kDictItem:
      return "dict item [" + Repr(arg_) + "]";
    case Access::kType:
      return "type()";
    case Access::kWeakRef:
      return "weakref()";
  }
  return "?";
}

PyObject* Accessor::ReadKey(PyObject* container, std::string* why) const {
  if (kind_ == Access::kDictItem || PyDict_CheckExact(container)) {
    PyObject* value = PyDict_GetItemWithError(container, arg_);
    if (value != nullptr) return Py_NewRef(value);
    if (PyErr_Occurred()) {
      Failed(why);
    } else if (why) {
      const bool item = kind_ == Access::kItem || kind_ == Access::kDictItem;
      *why = Name() + (item ? " is not in the dict" : " is not defined");
    }
    return nullptr;
  }
  PyObject* value = PyObject_GetItem(container, arg_);
  if (value == nullptr) Failed(why);
  return value;
}

void Accessor::Failed(std::string* why) const {
  std::string error = TakeError(why != nullptr);
  if (why) *why = "reading " + Name() + " raised " + error;
}

PyObject* ReadPath(const std::vector<Accessor>& path, const Frame& frame, std::string* why) {
  PyObject* value = nullptr;
  for (const Accessor& step : path) {
    PyObject* next = step.Read(value, frame, why);
    Py_XDECREF(value);
    if (next == nullptr) return nullptr;
    value = next;
  }
  return value;
}

}  // namespace kiln::guards
