// The guard tree's evaluation: source accessors, leaf checks (TENSOR_MATCH and torch's global state
// among them), the C interface the frame hook calls, and the Python class kiln._C.GuardManager.
#include "guards/guard_tree.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceType.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/Export.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "guards/guard_api.h"
#include "python_status.h"

// ATen/autocast_mode.h pulls in all of ATen's operators (ATen/ATen.h) for these two functions,
// which have had these signatures since torch 2.4.
namespace at::autocast {
TORCH_API bool is_autocast_enabled(at::DeviceType device_type);
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
}  // namespace at::autocast

namespace kiln::guards {
namespace {

// Reprs inside failure reasons are cut to this many characters: a module's repr can be pages.
constexpr size_t kMaxReprChars = 80;
// Sources nest one tuple per step; deeper than this is a malformed (or cyclic-looking) source.
constexpr int kMaxSourceDepth = 64;

// A type as failure reasons name it: module-qualified, since tp_name of a class defined in Python
// is only its bare name ("Parameter").
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

std::string Repr(PyObject* obj) { return Text(obj, /*repr=*/true); }

// Clears the pending Python exception; when `explain` is set, returns it as "Type: message".
// Guards never propagate exceptions: a guard that cannot be evaluated has failed.
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

PyObject* const* TupleItems(PyObject* tuple) {
  return reinterpret_cast<PyTupleObject*>(tuple)->ob_item;
}

// "torch.float32", as Python spells it.
std::string DtypeName(c10::ScalarType dtype) {
  try {
    return Repr(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
  } catch (const std::exception&) {
    return c10::toString(dtype);
  }
}

// What one evaluation reads from the frame about to run.
struct Frame {
  PyObject* const* slots;
  Py_ssize_t nslots;
  PyFunctionObject* func;  // null when the caller gave no function object
};

struct Eval {
  Frame frame;
  std::string* why;   // null on the hot path: reasons are built only when asked for
  const int* active;  // the tree's count of evaluations in progress
};

// ---------------------------------------------------------------------------------------------
// Accessors: one step of a source, from a parent value (or the frame, at the root) to a child.

enum class Access : uint8_t {
  kRoot,
  kLocal,
  kGlobal,
  kBuiltin,
  kClosure,
  kObject,
  kAttr,
  kInstanceDict,
  kItem,
  kType,
};

class Accessor {
 public:
  Accessor() = default;
  // Takes ownership of `arg` (a new reference, or null).
  Accessor(Access kind, Py_ssize_t index, PyObject* arg) : kind_(kind), index_(index), arg_(arg) {
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
  Accessor(Accessor&& other) noexcept
      : kind_(other.kind_), index_(other.index_), int_key_(other.int_key_), arg_(other.arg_) {
    other.arg_ = nullptr;
  }
  Accessor& operator=(Accessor&&) = delete;
  ~Accessor() { Py_XDECREF(arg_); }

  // Whether two accessors read the same child, so that their nodes merge.
  bool SameAs(const Accessor& other) const {
    if (kind_ != other.kind_) return false;
    switch (kind_) {
      case Access::kRoot:
      case Access::kInstanceDict:
      case Access::kType:
        return true;
      case Access::kLocal:
      case Access::kClosure:
        return index_ == other.index_;
      case Access::kObject:
        return arg_ == other.arg_;
      case Access::kGlobal:
      case Access::kBuiltin:
      case Access::kAttr:
      case Access::kItem: {
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

  // Returns a new reference to the child of `parent`, or null (no exception set, *why set when
  // `why` is not null) when it cannot be read.
  PyObject* Read(PyObject* parent, const Frame& frame, std::string* why) const {
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
      case Access::kType:
        return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(parent)));
    }
    return nullptr;
  }

  Access kind() const { return kind_; }

  // How failure reasons name this step.
  std::string Name() const {
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
      case Access::kType:
        return "type()";
    }
    return "?";
  }

 private:
  // container[arg_]; exact dicts (globals, builtins, __dict__, module registries) skip
  // PyObject_GetItem, and a missing key of one fails without creating a KeyError.
  PyObject* ReadKey(PyObject* container, std::string* why) const {
    if (PyDict_CheckExact(container)) {
      PyObject* value = PyDict_GetItemWithError(container, arg_);
      if (value != nullptr) return Py_NewRef(value);
      if (PyErr_Occurred()) {
        Failed(why);
      } else if (why) {
        *why = Name() + (kind_ == Access::kItem ? " is not in the dict" : " is not defined");
      }
      return nullptr;
    }
    PyObject* value = PyObject_GetItem(container, arg_);
    if (value == nullptr) Failed(why);
    return value;
  }

  void Failed(std::string* why) const {
    std::string error = TakeError(why != nullptr);
    if (why) *why = "reading " + Name() + " raised " + error;
  }

  Access kind_ = Access::kRoot;
  Py_ssize_t index_ = 0;     // slot or cell index, or the value of an int item key
  bool int_key_ = false;     // kItem: arg_ is an int, held in index_ too
  PyObject* arg_ = nullptr;  // owned: a name, key or fixed object
};

// ---------------------------------------------------------------------------------------------
// Leaf checks.

// Lower runs first within a node: a cheap check that fails spares the tensor checks.
enum Cost : int { kCheap = 0, kContainer = 1, kGlobalState = 2, kTensor = 3 };

class LeafCheck {
 public:
  LeafCheck(std::string description, Cost cost)
      : description_(std::move(description)), cost_(cost) {}
  virtual ~LeafCheck() = default;
  LeafCheck(const LeafCheck&) = delete;
  LeafCheck& operator=(const LeafCheck&) = delete;

  // Whether `value` passes. Leaves no exception set; on failure writes the reason to *why when
  // `why` is not null.
  virtual bool Run(PyObject* value, std::string* why) const = 0;
  // The same, for checks that compare the value with other values of the frame (by default the
  // frame is not needed).
  virtual bool RunIn(PyObject* value, const Frame& /*frame*/, std::string* why) const {
    return Run(value, why);
  }
  // False for checks that read no one value (global state, relations between several values):
  // they sit at the root.
  virtual bool ReadsValue() const { return true; }

  // What keeps a check's last answer valid (see Node::Run's fast path): kSameObject, the value
  // is the same object as then (its identity, or an immutable constant, decides the answer);
  // kSameDict, the value is a dict with the same version tag as then (its keys or length
  // decide it); kNothing, the check must run again.
  enum class Stability { kNothing, kSameObject, kSameDict };
  virtual Stability stability() const { return Stability::kNothing; }

  const std::string& description() const { return description_; }
  Cost cost() const { return cost_; }

 private:
  std::string description_;
  Cost cost_;
};

class TypeCheck : public LeafCheck {
 public:
  TypeCheck(PyTypeObject* type, std::string description)
      : LeafCheck(std::move(description), kCheap), type_(type) {
    Py_INCREF(type_);
  }
  ~TypeCheck() override { Py_DECREF(type_); }

  // An instance of a static type (int, tuple, ...) can never change class; a heap type's can
  // (obj.__class__ = Other).
  Stability stability() const override {
    return type_->tp_flags & Py_TPFLAGS_HEAPTYPE ? Stability::kNothing : Stability::kSameObject;
  }
  bool exact_tuple() const { return type_ == &PyTuple_Type; }

  bool Run(PyObject* value, std::string* why) const override {
    if (Py_TYPE(value) == type_) return true;
    if (why) *why = "expected type " + TypeName(type_) + ", got " + TypeName(Py_TYPE(value));
    return false;
  }

 private:
  PyTypeObject* type_;
};

class IdCheck : public LeafCheck {
 public:
  // With `on_dead` (a callable, or null) and an object that supports weak references, the check
  // holds a weak reference whose callback is `on_dead`: an object that dies takes the entry
  // with it (a deleted model's weights are freed) instead of being kept alive by the guard.
  // Otherwise it holds the object, so that its address cannot be reused by another object.
  IdCheck(PyObject* object, PyObject* on_dead, std::string description)
      : LeafCheck(std::move(description), kCheap) {
    if (on_dead != nullptr && PyType_SUPPORTS_WEAKREFS(Py_TYPE(object))) {
      ref_ = PyWeakref_NewRef(object, on_dead);
      if (ref_ != nullptr) return;
      PyErr_Clear();
    }
    ref_ = Py_NewRef(object);
    strong_ = true;
  }
  ~IdCheck() override { Py_DECREF(ref_); }
  // The same value object: a weakly held expected object it is cannot have died.
  Stability stability() const override { return Stability::kSameObject; }

  bool Run(PyObject* value, std::string* why) const override {
    PyObject* object = ref_;
    if (!strong_) {
      object = PyWeakref_GET_OBJECT(ref_);  // borrowed; None once the object died
      if (object == Py_None) {
        if (why) *why = "the object it expects no longer exists";
        return false;
      }
    }
    if (value == object) return true;
    if (why) *why = "expected the object " + Repr(object) + ", got " + Repr(value);
    return false;
  }

 private:
  PyObject* ref_;        // owned: the object, or a weak reference to it
  bool strong_ = false;  // ref_ is the object itself
};

class ConstantCheck : public LeafCheck {
 public:
  // Whether ("constant", value) is supported for a value of this type.
  static bool Supports(PyObject* value) {
    PyTypeObject* t = Py_TYPE(value);
    return value == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type ||
           t == &PyComplex_Type || t == &PyUnicode_Type || t == &PyBytes_Type ||
           t == &THPDtypeType || t == &THPDeviceType || t == &THPLayoutType ||
           t == &THPMemoryFormatType;
  }

  ConstantCheck(PyObject* value, std::string description)
      : LeafCheck(std::move(description), kCheap), value_(Py_NewRef(value)) {
    PyTypeObject* t = Py_TYPE(value);
    if (value == Py_None) {
      kind_ = Kind::kNone;
    } else if (t == &PyBool_Type) {
      kind_ = Kind::kBool;
    } else if (t == &PyFloat_Type) {
      kind_ = Kind::kFloat;
      float_ = PyFloat_AS_DOUBLE(value);
    } else if (t == &PyLong_Type) {
      int overflow = 0;
      int_ = PyLong_AsLongLongAndOverflow(value, &overflow);
      kind_ = overflow == 0 ? Kind::kSmallInt : Kind::kOther;
    }
  }
  ~ConstantCheck() override { Py_DECREF(value_); }
  // Constants are immutable objects of types whose class cannot be reassigned.
  Stability stability() const override { return Stability::kSameObject; }

  bool Run(PyObject* value, std::string* why) const override {
    bool ok = false;
    if (Py_TYPE(value) == Py_TYPE(value_)) {
      switch (kind_) {
        case Kind::kNone:
          ok = true;
          break;
        case Kind::kBool:
          ok = value == value_;
          break;
        case Kind::kSmallInt: {
          int overflow = 0;
          long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
          ok = overflow == 0 && v == int_;
          break;
        }
        case Kind::kFloat: {
          // NaN matches NaN, and -0.0 does not match 0.0: a graph specialized on one may
          // compute differently with the other (1 / x, copysign, atan2).
          double v = PyFloat_AS_DOUBLE(value);
          ok = (std::isnan(v) && std::isnan(float_)) ||
               (v == float_ && std::signbit(v) == std::signbit(float_));
          break;
        }
        case Kind::kOther: {
          int eq = PyObject_RichCompareBool(value, value_, Py_EQ);
          if (eq < 0) {
            std::string error = TakeError(why != nullptr);
            if (why) *why = "comparing with " + Repr(value_) + " raised " + error;
            return false;
          }
          ok = eq == 1;
          break;
        }
      }
    }
    if (!ok && why) {
      *why = "expected " + Repr(value_) + " (" + TypeName(Py_TYPE(value_)) + "), got " +
             Repr(value) + " (" + TypeName(Py_TYPE(value)) + ")";
    }
    return ok;
  }

 private:
  enum class Kind { kNone, kBool, kSmallInt, kFloat, kOther };
  PyObject* value_;
  Kind kind_ = Kind::kOther;
  long long int_ = 0;  // kSmallInt
  double float_ = 0;   // kFloat
};

class LenCheck : public LeafCheck {
 public:
  LenCheck(Py_ssize_t length, std::string description)
      : LeafCheck(std::move(description), kCheap), length_(length) {}
  Stability stability() const override { return Stability::kSameDict; }

  bool Run(PyObject* value, std::string* why) const override {
    // Subclasses count by their C-level size: torch.Size is a tuple, OrderedDict a dict.
    Py_ssize_t length;
    if (PyList_Check(value)) {
      length = PyList_GET_SIZE(value);
    } else if (PyTuple_Check(value)) {
      length = PyTuple_GET_SIZE(value);
    } else if (PyDict_Check(value)) {
      length = PyDict_GET_SIZE(value);
    } else {
      if (why) *why = "expected a list, tuple or dict, got " + TypeName(Py_TYPE(value));
      return false;
    }
    if (length == length_) return true;
    if (why) {
      *why = "length mismatch, expected " + std::to_string(length_) + ", got " +
             std::to_string(length);
    }
    return false;
  }

 private:
  Py_ssize_t length_;
};

class DictKeysCheck : public LeafCheck {
 public:
  DictKeysCheck(PyObject* keys, std::string description)  // keys: a tuple
      : LeafCheck(std::move(description), kContainer), keys_(Py_NewRef(keys)) {}
  ~DictKeysCheck() override { Py_DECREF(keys_); }
  Stability stability() const override { return Stability::kSameDict; }

  bool Run(PyObject* value, std::string* why) const override {
    if (!PyDict_CheckExact(value)) {
      if (why) *why = "expected a dict, got " + TypeName(Py_TYPE(value));
      return false;
    }
    bool ok = PyDict_GET_SIZE(value) == PyTuple_GET_SIZE(keys_);
    Py_ssize_t pos = 0;
    PyObject* key;
    PyObject* unused;
    for (Py_ssize_t i = 0; ok && PyDict_Next(value, &pos, &key, &unused); ++i) {
      PyObject* expected = PyTuple_GET_ITEM(keys_, i);
      if (key == expected) continue;  // interned names: the usual case
      ok = false;
      if (Py_TYPE(key) != Py_TYPE(expected)) break;
      Py_INCREF(key);  // __eq__ may run Python code that mutates the dict
      int eq = PyObject_RichCompareBool(key, expected, Py_EQ);
      Py_DECREF(key);
      if (eq < 0) {
        std::string error = TakeError(why != nullptr);
        if (why) *why = "comparing keys raised " + error;
        return false;
      }
      ok = eq == 1;
    }
    if (!ok && why) {
      PyObject* actual = PySequence_Tuple(value);
      if (actual == nullptr) PyErr_Clear();
      *why = "expected keys " + Repr(keys_) + ", got " + (actual ? Repr(actual) : "?");
      Py_XDECREF(actual);
    }
    return ok;
  }

 private:
  PyObject* keys_;
};

// Reads a whole source (its accessors, root first) from the frame: a new reference, or null with
// no exception set (and *why set when `why` is not null).
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

// ("has_attr", name) / ("no_attr", name): what hasattr() or getattr() with a default found
// about an attribute still holds. Looked up as getattr does: class attributes and __getattr__
// count.
class HasAttrCheck : public LeafCheck {
 public:
  // name: an interned str, owned.
  HasAttrCheck(PyObject* name, bool present, std::string description)
      : LeafCheck(std::move(description), kCheap), name_(name), present_(present) {}
  ~HasAttrCheck() override { Py_DECREF(name_); }

  bool Run(PyObject* value, std::string* why) const override {
    PyObject* found = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    int present = PyObject_GetOptionalAttr(value, name_, &found);
#else
    int present = _PyObject_LookupAttr(value, name_, &found);
#endif
    if (present < 0) {
      std::string error = TakeError(why != nullptr);
      if (why) *why = "looking up attribute " + Repr(name_) + " raised " + error;
      return false;
    }
    Py_XDECREF(found);
    if ((present == 1) == present_) return true;
    if (why) *why = "attribute " + Repr(name_) + (present_ ? " is gone" : " now exists");
    return false;
  }

 private:
  PyObject* name_;
  bool present_;
};

// ("no_item", key): the value, a dict, has no item `key` (an instance __dict__ that must keep
// not shadowing a method of the class).
class NoItemCheck : public LeafCheck {
 public:
  NoItemCheck(PyObject* key, std::string description)  // key: owned
      : LeafCheck(std::move(description), kCheap), key_(key) {}
  ~NoItemCheck() override { Py_DECREF(key_); }
  Stability stability() const override { return Stability::kSameDict; }

  bool Run(PyObject* value, std::string* why) const override {
    if (!PyDict_Check(value)) {
      if (why) *why = "expected a dict, got " + TypeName(Py_TYPE(value));
      return false;
    }
    int present = PyDict_Contains(value, key_);
    if (present == 0) return true;
    if (present < 0) {
      std::string error = TakeError(why != nullptr);
      if (why) *why = "looking up " + Repr(key_) + " raised " + error;
      return false;
    }
    if (why) *why = Repr(key_) + " is now in it";
    return false;
  }

 private:
  PyObject* key_;
};

// ("is", source): the value is the very object found at another source of the frame (the same
// tensor passed twice, a list that contains itself).
class AliasCheck : public LeafCheck {
 public:
  AliasCheck(std::vector<Accessor> other, std::string description)
      : LeafCheck(std::move(description), kCheap), other_(std::move(other)) {}

  bool Run(PyObject* /*value*/, std::string* why) const override {
    if (why) *why = "needs the frame";
    return false;
  }

  bool RunIn(PyObject* value, const Frame& frame, std::string* why) const override {
    PyObject* other = ReadPath(other_, frame, why);
    if (other == nullptr) return false;
    const bool same = other == value;
    Py_DECREF(other);
    if (!same && why) *why = "expected the object found at the other source, got another";
    return same;
  }

 private:
  std::vector<Accessor> other_;
};

// ("distinct", (source, ...)): the values at these sources are distinct objects (graph inputs
// traced as distinct tensors, which a compiled graph may assume do not alias).
class DistinctCheck : public LeafCheck {
 public:
  DistinctCheck(std::vector<std::vector<Accessor>> sources, std::string description)
      : LeafCheck(std::move(description), kContainer), sources_(std::move(sources)) {}

  bool ReadsValue() const override { return false; }

  bool Run(PyObject* /*value*/, std::string* why) const override {
    if (why) *why = "needs the frame";
    return false;
  }

  bool RunIn(PyObject* /*value*/, const Frame& frame, std::string* why) const override {
    // References are held until the comparison is done: an address freed early could be reused
    // by the next value read. A few sources (the usual case: a graph's tensor inputs) are read
    // into the stack and compared pairwise; more are sorted.
    constexpr size_t kSmall = 8;
    PyObject* small[kSmall];
    std::vector<PyObject*> large;
    const size_t n = sources_.size();
    PyObject** values = small;
    if (n > kSmall) {
      large.resize(n);
      values = large.data();
    }
    size_t read = 0;
    bool ok = true;
    for (; read < n; ++read) {
      values[read] = ReadPath(sources_[read], frame, why);
      if (values[read] == nullptr) {
        ok = false;
        break;
      }
    }
    if (ok && n <= kSmall) {
      for (size_t i = 1; ok && i < n; ++i) {
        for (size_t j = 0; ok && j < i; ++j) ok = values[i] != values[j];
      }
    } else if (ok) {
      std::vector<PyObject*> sorted(values, values + n);
      std::sort(sorted.begin(), sorted.end());
      ok = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    }
    if (!ok && read == n && why) *why = "two of them are the same object";
    for (size_t i = 0; i < read; ++i) Py_DECREF(values[i]);
    return ok;
  }

 private:
  std::vector<std::vector<Accessor>> sources_;
};

// TENSOR_MATCH, the check most guards are: everything about a tensor that a graph specializes on,
// except its values. Dispatch keys are compared as (keys | tls included) - tls excluded, both at
// record time and at check time, as TorchDynamo does, so that a change in the thread's dispatch
// state (inference mode, functorch levels) fails the guard.
class TensorCheck : public LeafCheck {
 public:
  // Fails when `example` is not a tensor or has symbolic sizes.
  static StatusOr<std::unique_ptr<TensorCheck>> Create(PyObject* example, std::string description) {
    bool is_tensor = false;
    try {
      is_tensor = THPVariable_Check(example);
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    if (!is_tensor) {
      return Status::InvalidArgument("('tensor', example) needs a torch.Tensor, got " +
                                     TypeName(Py_TYPE(example)));
    }
    std::unique_ptr<TensorCheck> check(new TensorCheck(std::move(description)));
    try {
      const at::Tensor& t = THPVariable_Unpack(example);
      if (!t.defined()) {
        return Status::InvalidArgument("('tensor', example) got an undefined tensor");
      }
      check->type_ = Py_TYPE(example);
      Py_INCREF(check->type_);
      check->dispatch_keys_ = LocalKeys(t);
      check->dtype_ = t.scalar_type();
      check->device_ = t.device();
      check->requires_grad_ = t.requires_grad();
      check->strided_ = t.layout() == c10::kStrided;
      if (!Concrete(t.sym_sizes(), &check->sizes_) ||
          (check->strided_ && !Concrete(t.sym_strides(), &check->strides_))) {
        return Status::InvalidArgument(
            "('tensor', example) needs concrete sizes and strides, got symbolic ones");
      }
    } catch (const std::exception& e) {
      PyErr_Clear();
      return Status::InvalidArgument(
          std::string("('tensor', example): reading the example raised: ") + e.what());
    }
    return check;
  }

  ~TensorCheck() override { Py_XDECREF(type_); }

  bool Run(PyObject* value, std::string* why) const override {
    // The exact type: Tensor, Parameter and each subclass trace differently. Matching it also
    // proves `value` is a THPVariable.
    if (Py_TYPE(value) != type_) {
      if (why) *why = "expected type " + TypeName(type_) + ", got " + TypeName(Py_TYPE(value));
      return false;
    }
    try {
      return Match(THPVariable_Unpack(value), why);
    } catch (const std::exception& e) {
      // A subclass with Python-level sizes can raise from sym_sizes().
      if (PyErr_Occurred()) PyErr_Clear();
      if (why) *why = std::string("reading the tensor raised: ") + e.what();
      return false;
    }
  }

 private:
  explicit TensorCheck(std::string description)
      : LeafCheck(std::move(description), kTensor), device_(c10::kCPU) {}

  static c10::DispatchKeySet LocalKeys(const at::Tensor& t) {
    c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
    return (t.key_set() | tls.included_) - tls.excluded_;
  }

  static bool Concrete(c10::SymIntArrayRef dims, std::vector<int64_t>* out) {
    out->clear();
    for (const c10::SymInt& d : dims) {
      std::optional<int64_t> v = d.maybe_as_int();
      if (!v) return false;
      out->push_back(*v);
    }
    return true;
  }

  bool Match(const at::Tensor& t, std::string* why) const {
    if (!t.defined()) {
      if (why) *why = "the tensor is undefined";
      return false;
    }
    if (t.scalar_type() != dtype_) {
      if (why) {
        *why =
            "dtype mismatch, expected " + DtypeName(dtype_) + ", got " + DtypeName(t.scalar_type());
      }
      return false;
    }
    if (t.device() != device_) {
      if (why) *why = "device mismatch, expected " + device_.str() + ", got " + t.device().str();
      return false;
    }
    if (t.requires_grad() != requires_grad_) {
      if (why) {
        *why = std::string("requires_grad mismatch, expected ") + Bool(requires_grad_) + ", got " +
               Bool(t.requires_grad());
      }
      return false;
    }
    c10::DispatchKeySet keys = LocalKeys(t);
    if (keys != dispatch_keys_) {
      if (why) {
        *why = "dispatch key set mismatch, expected " + c10::toString(dispatch_keys_) + ", got " +
               c10::toString(keys);
      }
      return false;
    }
    c10::SymIntArrayRef sizes = t.sym_sizes();
    if (sizes.size() != sizes_.size()) {
      if (why) {
        *why = "rank mismatch, expected " + std::to_string(sizes_.size()) + ", got " +
               std::to_string(sizes.size());
      }
      return false;
    }
    if (!MatchDims(sizes, sizes_, "size", why)) return false;
    return !strided_ || MatchDims(t.sym_strides(), strides_, "stride", why);
  }

  static bool MatchDims(c10::SymIntArrayRef actual, const std::vector<int64_t>& expected,
                        const char* what, std::string* why) {
    if (actual.size() != expected.size()) {
      if (why) *why = std::string(what) + " rank mismatch";
      return false;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      std::optional<int64_t> v = actual[i].maybe_as_int();
      if (v && *v == expected[i]) continue;
      if (why) {
        *why = std::string(what) + " mismatch at dim " + std::to_string(i) + ", expected " +
               std::to_string(expected[i]) + ", got " + (v ? std::to_string(*v) : "a symbol");
      }
      return false;
    }
    return true;
  }

  PyTypeObject* type_ = nullptr;  // owned
  c10::DispatchKeySet dispatch_keys_;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  c10::Device device_;
  bool requires_grad_ = false;
  bool strided_ = true;  // sparse and other non-strided layouts have no strides to compare
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
};

// The process- and thread-wide torch settings that change what a captured graph computes.
struct GlobalState {
  bool grad_enabled;
  c10::ScalarType default_dtype;
  bool deterministic;
  bool deterministic_warn_only;
  int8_t tf32_cublas;  // 1 / 0, or -1 when torch refused to say (mixed legacy and new TF32 APIs)
  int8_t tf32_cudnn;
  bool autocast_cpu;
  bool autocast_cuda;
  // The dtype autocast casts to where it is enabled (Undefined where it is not): a graph traced
  // under bfloat16 autocast has bfloat16 casts, wrong under float16 autocast.
  c10::ScalarType autocast_cpu_dtype;
  c10::ScalarType autocast_cuda_dtype;

  // `cuda`: whether the process has a CUDA device. Without one the TF32 flags change no
  // result, and they are left unread: reading them costs hash lookups (about 100 ns, a tenth
  // of kiln's whole per-call cost).
  static GlobalState Now(bool cuda) {
    at::Context& context = at::globalContext();
    GlobalState s;
    s.grad_enabled = c10::GradMode::is_enabled();
    s.default_dtype = c10::get_default_dtype_as_scalartype();
    s.deterministic = context.deterministicAlgorithms();
    s.deterministic_warn_only = context.deterministicAlgorithmsWarnOnly();
    s.tf32_cublas = cuda ? Flag([&] { return context.allowTF32CuBLAS(); }) : 0;
    s.tf32_cudnn = cuda ? Flag([&] { return context.allowTF32CuDNN(); }) : 0;
    s.autocast_cpu = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
    s.autocast_cuda = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
    s.autocast_cpu_dtype = s.autocast_cpu ? at::autocast::get_autocast_dtype(c10::DeviceType::CPU)
                                          : c10::ScalarType::Undefined;
    s.autocast_cuda_dtype = s.autocast_cuda
                                ? at::autocast::get_autocast_dtype(c10::DeviceType::CUDA)
                                : c10::ScalarType::Undefined;
    return s;
  }

  template <typename F>
  static int8_t Flag(F read) {
    try {
      return read() ? 1 : 0;
    } catch (const std::exception&) {
      return -1;
    }
  }
};

class GlobalStateCheck : public LeafCheck {
 public:
  explicit GlobalStateCheck(std::string description)
      : LeafCheck(std::move(description), kGlobalState),
        cuda_(at::globalContext().hasCUDA()),
        expected_(GlobalState::Now(cuda_)) {}

  bool ReadsValue() const override { return false; }

  bool Run(PyObject* /*value*/, std::string* why) const override {
    GlobalState now = GlobalState::Now(cuda_);
    const GlobalState& e = expected_;
    if (now.grad_enabled != e.grad_enabled) {
      return Differs("grad mode", e.grad_enabled, now.grad_enabled, why);
    }
    if (now.default_dtype != e.default_dtype) {
      if (why) {
        *why = "default dtype changed, expected " + DtypeName(e.default_dtype) + ", got " +
               DtypeName(now.default_dtype);
      }
      return false;
    }
    if (now.deterministic != e.deterministic) {
      return Differs("deterministic algorithms", e.deterministic, now.deterministic, why);
    }
    if (now.deterministic_warn_only != e.deterministic_warn_only) {
      return Differs("deterministic algorithms warn-only", e.deterministic_warn_only,
                     now.deterministic_warn_only, why);
    }
    if (now.tf32_cublas != e.tf32_cublas) {
      return Differs("cuBLAS TF32", e.tf32_cublas, now.tf32_cublas, why);
    }
    if (now.tf32_cudnn != e.tf32_cudnn) {
      return Differs("cuDNN TF32", e.tf32_cudnn, now.tf32_cudnn, why);
    }
    if (now.autocast_cpu != e.autocast_cpu) {
      return Differs("CPU autocast", e.autocast_cpu, now.autocast_cpu, why);
    }
    if (now.autocast_cuda != e.autocast_cuda) {
      return Differs("CUDA autocast", e.autocast_cuda, now.autocast_cuda, why);
    }
    for (const auto& [what, expected, got] :
         {std::tuple{"CPU autocast dtype", e.autocast_cpu_dtype, now.autocast_cpu_dtype},
          std::tuple{"CUDA autocast dtype", e.autocast_cuda_dtype, now.autocast_cuda_dtype}}) {
      if (expected != got) {
        if (why) {
          *why = std::string(what) + " changed, expected " + DtypeName(expected) + ", got " +
                 DtypeName(got);
        }
        return false;
      }
    }
    return true;
  }

 private:
  static bool Differs(const char* what, int expected, int got, std::string* why) {
    auto text = [](int v) { return v < 0 ? "unknown" : Bool(v != 0); };
    if (why) {
      *why = std::string(what) + " changed, expected " + text(expected) + ", got " + text(got);
    }
    return false;
  }

  bool cuda_;
  GlobalState expected_;
};

// ---------------------------------------------------------------------------------------------
// Parsing the Python tuples that describe a guard.

bool KindIs(std::string_view kind, const char* name) { return kind == name; }

// A guard's source or check that cannot be parsed: ValueError at kiln._C.GuardManager.add.
Status Invalid(std::string message) { return Status::InvalidArgument(std::move(message)); }

// Sets *kind to the tuple's first element, which must be a str.
Status TupleKind(PyObject* t, const char* what, std::string_view* kind) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) == 0 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
    return Invalid(std::string(what) + " must be a tuple whose first element is a str, got " +
                   Repr(t));
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &size);
  if (utf8 == nullptr) {
    return Invalid(std::string(what) + " kind is not valid UTF-8: " + TakeError(true));
  }
  *kind = std::string_view(utf8, static_cast<size_t>(size));
  return Status::OK();
}

Status Arity(PyObject* t, Py_ssize_t n, const char* form) {
  if (PyTuple_GET_SIZE(t) == n) return Status::OK();
  return Invalid(std::string(form) + " takes " + std::to_string(n) + " elements, got " + Repr(t));
}

// A non-negative exact int (bool excluded) as Py_ssize_t.
bool Index(PyObject* obj, Py_ssize_t* out) {
  if (!PyLong_CheckExact(obj)) return false;
  Py_ssize_t v = PyLong_AsSsize_t(obj);
  if (v < 0) {
    PyErr_Clear();
    return false;
  }
  *out = v;
  return true;
}

// A str, interned so that dict lookups and getattr usually compare by identity.
bool InternedName(PyObject* obj, PyObject** out) {
  if (!PyUnicode_CheckExact(obj)) return false;
  PyObject* name = Py_NewRef(obj);
  PyUnicode_InternInPlace(&name);
  *out = name;
  return true;
}

// Appends the accessors of `source` to *path, root first.
Status ParseSource(PyObject* source, int depth, std::vector<Accessor>* path) {
  if (depth > kMaxSourceDepth) {
    return Invalid("source nests deeper than " + std::to_string(kMaxSourceDepth) + " steps");
  }
  std::string_view kind;
  KILN_RETURN_IF_ERROR(TupleKind(source, "a source", &kind));
  Py_ssize_t index = 0;
  PyObject* name = nullptr;
  if (KindIs(kind, "local") || KindIs(kind, "closure")) {
    const bool local = KindIs(kind, "local");
    const char* form = local ? "('local', i)" : "('closure', i)";
    KILN_RETURN_IF_ERROR(Arity(source, 2, form));
    if (!Index(PyTuple_GET_ITEM(source, 1), &index)) {
      return Invalid(std::string(form) + " needs an int i >= 0, got " + Repr(source));
    }
    path->emplace_back(local ? Access::kLocal : Access::kClosure, index, nullptr);
    return Status::OK();
  }
  if (KindIs(kind, "global") || KindIs(kind, "builtin")) {
    const bool global = KindIs(kind, "global");
    const char* form = global ? "('global', name)" : "('builtin', name)";
    KILN_RETURN_IF_ERROR(Arity(source, 2, form));
    if (!InternedName(PyTuple_GET_ITEM(source, 1), &name)) {
      return Invalid(std::string(form) + " needs a str name, got " + Repr(source));
    }
    path->emplace_back(global ? Access::kGlobal : Access::kBuiltin, 0, name);
    return Status::OK();
  }
  if (KindIs(kind, "object")) {
    KILN_RETURN_IF_ERROR(Arity(source, 2, "('object', obj)"));
    path->emplace_back(Access::kObject, 0, Py_NewRef(PyTuple_GET_ITEM(source, 1)));
    return Status::OK();
  }
  if (KindIs(kind, "attr")) {
    KILN_RETURN_IF_ERROR(Arity(source, 3, "('attr', parent, name)"));
    if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(source, 2))) {
      return Invalid("('attr', parent, name) needs a str name, got " + Repr(source));
    }
    KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    InternedName(PyTuple_GET_ITEM(source, 2), &name);
    path->emplace_back(Access::kAttr, 0, name);
    return Status::OK();
  }
  if (KindIs(kind, "item")) {
    KILN_RETURN_IF_ERROR(Arity(source, 3, "('item', parent, key)"));
    KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    path->emplace_back(Access::kItem, 0, Py_NewRef(PyTuple_GET_ITEM(source, 2)));
    return Status::OK();
  }
  if (KindIs(kind, "instance_dict") || KindIs(kind, "type")) {
    const bool dict = KindIs(kind, "instance_dict");
    KILN_RETURN_IF_ERROR(Arity(source, 2, dict ? "('instance_dict', parent)" : "('type', parent)"));
    KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    path->emplace_back(dict ? Access::kInstanceDict : Access::kType, 0, nullptr);
    return Status::OK();
  }
  return Invalid(
      "unknown source kind '" + std::string(kind) +
      "' (expected local, global, builtin, closure, object, attr, instance_dict, item or "
      "type)");
}

StatusOr<std::unique_ptr<LeafCheck>> ParseCheck(PyObject* check, PyObject* on_dead,
                                                std::string description) {
  std::string_view kind;
  KILN_RETURN_IF_ERROR(TupleKind(check, "a check", &kind));
  if (KindIs(kind, "global_state")) {
    KILN_RETURN_IF_ERROR(Arity(check, 1, "('global_state',)"));
    return std::make_unique<GlobalStateCheck>(std::move(description));
  }
  if (KindIs(kind, "type")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('type', t)"));
    PyObject* type = PyTuple_GET_ITEM(check, 1);
    if (!PyType_Check(type)) {
      return Invalid("('type', t) needs a type, got " + Repr(type));
    }
    return std::make_unique<TypeCheck>(reinterpret_cast<PyTypeObject*>(type),
                                       std::move(description));
  }
  if (KindIs(kind, "id")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('id', obj)"));
    return std::make_unique<IdCheck>(PyTuple_GET_ITEM(check, 1), on_dead, std::move(description));
  }
  if (KindIs(kind, "constant")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('constant', value)"));
    PyObject* value = PyTuple_GET_ITEM(check, 1);
    if (!ConstantCheck::Supports(value)) {
      return Invalid(
          "('constant', value) supports None, bool, int, float, complex, str, bytes and "
          "torch.dtype/device/layout/memory_format, got " +
          TypeName(Py_TYPE(value)) + "; guard it with ('id', obj) or ('type', t)");
    }
    return std::make_unique<ConstantCheck>(value, std::move(description));
  }
  if (KindIs(kind, "len")) {
    Py_ssize_t length = 0;
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('len', n)"));
    if (!Index(PyTuple_GET_ITEM(check, 1), &length)) {
      return Invalid("('len', n) needs an int n >= 0, got " + Repr(check));
    }
    return std::make_unique<LenCheck>(length, std::move(description));
  }
  if (KindIs(kind, "dict_keys")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('dict_keys', keys)"));
    PyObject* keys = PyTuple_GET_ITEM(check, 1);
    if (!PyTuple_Check(keys)) {
      return Invalid("('dict_keys', keys) needs a tuple of keys, got " + Repr(keys));
    }
    return std::make_unique<DictKeysCheck>(keys, std::move(description));
  }
  if (KindIs(kind, "tensor")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('tensor', example)"));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<TensorCheck> tensor,
                          TensorCheck::Create(PyTuple_GET_ITEM(check, 1), std::move(description)));
    return tensor;
  }
  if (KindIs(kind, "has_attr") || KindIs(kind, "no_attr")) {
    const bool present = KindIs(kind, "has_attr");
    const char* form = present ? "('has_attr', name)" : "('no_attr', name)";
    PyObject* name = nullptr;
    KILN_RETURN_IF_ERROR(Arity(check, 2, form));
    if (!InternedName(PyTuple_GET_ITEM(check, 1), &name)) {
      return Invalid(std::string(form) + " needs a str name, got " + Repr(check));
    }
    return std::make_unique<HasAttrCheck>(name, present, std::move(description));
  }
  if (KindIs(kind, "no_item")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('no_item', key)"));
    PyObject* key = PyTuple_GET_ITEM(check, 1);
    if (PyObject_Hash(key) == -1) {
      return Invalid("('no_item', key) needs a hashable key: " + TakeError(true));
    }
    return std::make_unique<NoItemCheck>(Py_NewRef(key), std::move(description));
  }
  if (KindIs(kind, "is")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('is', source)"));
    std::vector<Accessor> other;
    KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(check, 1), 0, &other));
    return std::make_unique<AliasCheck>(std::move(other), std::move(description));
  }
  if (KindIs(kind, "distinct")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('distinct', sources)"));
    PyObject* sources = PyTuple_GET_ITEM(check, 1);
    if (!PyTuple_Check(sources) || PyTuple_GET_SIZE(sources) < 2) {
      return Invalid("('distinct', sources) needs a tuple of two or more sources, got " +
                     Repr(sources));
    }
    std::vector<std::vector<Accessor>> paths(PyTuple_GET_SIZE(sources));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sources); ++i) {
      KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(sources, i), 0, &paths[i]));
    }
    return std::make_unique<DistinctCheck>(std::move(paths), std::move(description));
  }
  return Invalid(
      "unknown check kind '" + std::string(kind) +
      "' (expected type, id, constant, len, dict_keys, tensor, has_attr, no_attr, no_item, "
      "is, distinct or global_state)");
}

}  // namespace

// A dict's version tag: globally unique, and changed by every mutation that stores another
// object or removes a key (PEP 509; CPython 3.11 and 3.12 keep it though 3.12 deprecates it for
// extensions). 0 where it is not available: never equal to a recorded one.
uint64_t DictVersion(PyObject* dict) {
#if PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)dict;
  return 0;
#endif
}

// ---------------------------------------------------------------------------------------------
// The tree.

// One value of the frame: how it is read from its parent, the checks on it, and the values read
// from it in turn.
class Node {
 public:
  explicit Node(Accessor accessor) : accessor_(std::move(accessor)) {}

  Node* FindOrAddChild(Accessor accessor) {
    for (const std::unique_ptr<Node>& child : children_) {
      if (child->accessor_.SameAs(accessor)) return child.get();
    }
    children_.push_back(std::make_unique<Node>(std::move(accessor)));
    return children_.back().get();
  }

  // Keeps checks ordered by cost, in insertion order within one cost.
  void AddCheck(std::unique_ptr<LeafCheck> check) {
    auto at = checks_.begin();
    while (at != checks_.end() && (*at)->cost() <= check->cost()) ++at;
    checks_.insert(at, std::move(check));
  }

  // Works out, after guards were added, what the fast path of Run may skip.
  void Prepare() {
    for (const std::unique_ptr<Node>& child : children_) child->Prepare();
    // A value checked to be exactly a tuple is immutable: its length and items are decided by
    // the object too.
    bool tuple = false;
    for (const std::unique_ptr<LeafCheck>& check : checks_) {
      auto* type = dynamic_cast<const TypeCheck*>(check.get());
      tuple = tuple || (type != nullptr && type->exact_tuple());
    }
    own_same_dict_ = true;
    same_object_ = accessor_.kind() == Access::kItem;
    for (const std::unique_ptr<LeafCheck>& check : checks_) {
      LeafCheck::Stability s = check->stability();
      own_same_dict_ = own_same_dict_ && s != LeafCheck::Stability::kNothing;
      same_object_ = same_object_ && (s == LeafCheck::Stability::kSameObject ||
                                      (tuple && s == LeafCheck::Stability::kSameDict));
    }
    for (const std::unique_ptr<Node>& child : children_) {
      same_object_ = same_object_ && tuple && child->same_object_;
    }
    seen_version_ = 0;
  }

  // The fast path (when no reason is asked for): a node whose value is a dict remembers the
  // version tag it last passed with. While the dict has that version, its items are the same
  // objects, so the checks whose answer only those decide are skipped: its own checks on its
  // keys and length, and its items' identity and constant checks (an instance __dict__ of
  // module constants, a module's _parameters). Everything else runs.
  bool Run(PyObject* value, const Eval& eval) {
    uint64_t version = 0;
    bool unchanged = false;
    // Exact dicts only: a subclass's __getitem__ may answer otherwise for the same contents.
    if (eval.why == nullptr && value != nullptr && PyDict_CheckExact(value)) {
      version = DictVersion(value);
      unchanged = version != 0 && version == seen_version_;
    }
    if (!(unchanged && own_same_dict_)) {
      for (const std::unique_ptr<LeafCheck>& check : checks_) {
        if (!check->RunIn(value, eval.frame, eval.why)) {
          if (eval.why) *eval.why = check->description() + ": " + *eval.why;
          return false;
        }
      }
    }
    for (size_t i = 0; i < children_.size(); ++i) {
      Node* child = children_[i].get();
      if (unchanged && child->same_object_) continue;
      PyObject* child_value = child->accessor_.Read(value, eval.frame, eval.why);
      bool ok = false;
      if (child_value != nullptr) {
        ok = child->Run(child_value, eval);
        Py_DECREF(child_value);
      } else if (eval.why) {
        *eval.why = child->FirstDescription() + ": " + *eval.why;
      }
      if (!ok) {
        NoteFailure(i, eval);
        return false;
      }
    }
    // The version read before the checks: a mutation made by a property a check read makes
    // the next evaluation a full one.
    if (version != 0) seen_version_ = version;
    return true;
  }

  void Describe(std::vector<std::string>* out) const {
    for (const std::unique_ptr<LeafCheck>& check : checks_) out->push_back(check->description());
    for (const std::unique_ptr<Node>& child : children_) child->Describe(out);
  }

 private:
  // Every node below the root carries at least one check in its subtree: Add makes nodes only on
  // the way to a check.
  const std::string& FirstDescription() const {
    if (!checks_.empty()) return checks_.front()->description();
    return children_.front()->FirstDescription();
  }

  // Moves a child that fails often ahead of a sibling that fails less, so that a stale entry is
  // rejected early. Only the sole evaluation in progress may do it: another one, paused in a
  // property's Python code, may be iterating these children. This one iterates nothing more: it
  // returns false all the way up.
  void NoteFailure(size_t i, const Eval& eval) {
    Node* child = children_[i].get();
    ++child->failures_;
    if (*eval.active == 1 && i > 0 && children_[i - 1]->failures_ < child->failures_) {
      std::swap(children_[i - 1], children_[i]);
    }
  }

  Accessor accessor_;
  std::vector<std::unique_ptr<LeafCheck>> checks_;
  std::vector<std::unique_ptr<Node>> children_;
  uint64_t failures_ = 0;
  uint64_t seen_version_ = 0;   // the dict version this node last passed with, or 0
  bool own_same_dict_ = false;  // its own checks hold while its dict is unchanged
  bool same_object_ = false;    // an item whose whole subtree holds while it is the same object
};

GuardTree::GuardTree(PyObject* on_dead)
    : root_(std::make_unique<Node>(Accessor())), on_dead_(Py_XNewRef(on_dead)) {}

GuardTree::~GuardTree() {
  root_.reset();  // the checks' weak references first: their callback is on_dead_
  Py_XDECREF(on_dead_);
}

Status GuardTree::Add(PyObject* source, PyObject* check, std::string description) {
  if (active_ > 0) {
    return Status::InvalidArgument("cannot add a guard while the tree is being evaluated");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<LeafCheck> leaf,
                        ParseCheck(check, on_dead_, std::move(description)));
  Node* node = root_.get();
  if (leaf->ReadsValue()) {
    // Parse the whole source before touching the tree, so that a malformed one adds nothing.
    std::vector<Accessor> path;
    KILN_RETURN_IF_ERROR(ParseSource(source, 0, &path));
    for (Accessor& step : path) node = node->FindOrAddChild(std::move(step));
  }
  node->AddCheck(std::move(leaf));
  ++num_checks_;
  prepared_ = false;
  return Status::OK();
}

bool GuardTree::Check(PyObject* const* slots, Py_ssize_t nslots, PyObject* func, std::string* why) {
  PyFunctionObject* function = func != nullptr && PyFunction_Check(func)
                                   ? reinterpret_cast<PyFunctionObject*>(func)
                                   : nullptr;
  const Eval eval{{slots, nslots, function}, why, &active_};
  if (!prepared_ && active_ == 0) {
    root_->Prepare();
    prepared_ = true;
  }
  ++active_;
  bool ok = false;
  try {
    ok = root_->Run(nullptr, eval);
  } catch (const std::exception& e) {
    // Checks catch torch's errors themselves; this is for std::bad_alloc while explaining.
    if (why) *why = std::string("evaluating the guards raised: ") + e.what();
  }
  --active_;
  if (PyErr_Occurred()) PyErr_Clear();
  return ok;
}

std::vector<std::string> GuardTree::Describe() const {
  std::vector<std::string> out;
  out.reserve(num_checks_);
  root_->Describe(&out);
  return out;
}

void RegisterPython(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<GuardTree>(m, "GuardManager",
                        "The guards of one compiled entry, evaluated in C++ by the frame hook.\n"
                        "Sources and checks are tuples; see client/guards/guard_tree.h.")
      .def(py::init([](py::object on_dead) {
             return std::make_unique<GuardTree>(on_dead.is_none() ? nullptr : on_dead.ptr());
           }),
           py::arg("on_dead") = py::none(),
           "on_dead: called (with a dead weak reference) when an object an ('id', obj) check "
           "expects dies")
      .def(
          "add",
          [](GuardTree& self, py::object source, py::object check, std::string description) {
            ThrowIfError(self.Add(source.ptr(), check.ptr(), std::move(description)));
          },
          py::arg("source"), py::arg("check"), py::arg("description"),
          "Adds the guard `check` on the value at `source`; ValueError when either is malformed.")
      .def(
          "check",
          [](GuardTree& self, py::tuple slots, py::object func) {
            return self.Check(TupleItems(slots.ptr()), PyTuple_GET_SIZE(slots.ptr()), func.ptr(),
                              nullptr);
          },
          py::arg("slots"), py::arg("func"),
          "Whether every guard passes for a frame with these argument slots and function.")
      .def(
          "failure_reason",
          [](GuardTree& self, py::tuple slots, py::object func) -> py::object {
            std::string why;
            if (self.Check(TupleItems(slots.ptr()), PyTuple_GET_SIZE(slots.ptr()), func.ptr(),
                           &why)) {
              return py::none();
            }
            return py::str(why);
          },
          py::arg("slots"), py::arg("func"),
          "The first failing guard's description and why it failed; None when all pass.")
      .def(
          "describe",
          [](const GuardTree& self) {
            py::list out;
            for (const std::string& d : self.Describe()) out.append(py::str(d));
            return out;
          },
          "The guards' descriptions, in the order of the tree.")
      .def("__len__", &GuardTree::size)
      .def("__repr__", [](const GuardTree& self) {
        return "<kiln._C.GuardManager with " + std::to_string(self.size()) + " guards>";
      });
}

}  // namespace kiln::guards

extern "C" void* kiln_guard_unwrap(PyObject* manager) {
  namespace py = pybind11;
  py::handle handle(manager);
  try {
    if (py::isinstance<kiln::guards::GuardTree>(handle)) {
      return handle.cast<kiln::guards::GuardTree*>();
    }
  } catch (const std::exception&) {
    PyErr_Clear();
  }
  PyErr_Format(PyExc_TypeError, "expected a kiln._C.GuardManager, got %.200s",
               Py_TYPE(manager)->tp_name);
  return nullptr;
}

extern "C" int kiln_guard_check(void* tree, PyObject* const* slots, Py_ssize_t nslots,
                                PyObject* func) {
  return static_cast<kiln::guards::GuardTree*>(tree)->Check(slots, nslots, func, nullptr) ? 1 : 0;
}

extern "C" int kiln_torch_jit_tracing(void) { return torch::jit::tracer::isTracing() ? 1 : 0; }
