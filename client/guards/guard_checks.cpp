// The guard tree's leaf checks: what must hold of one value (its type, identity, constant value,
// length, dict keys, tensor metadata, attributes, items) or of the frame as a whole.
#include "guards/guard_checks.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceType.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/Export.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "guards/guard_reasons.h"

// ATen/autocast_mode.h pulls in all of ATen's operators (ATen/ATen.h) for these two functions,
// which have had these signatures since torch 2.4.
namespace at::autocast {
TORCH_API bool is_autocast_enabled(at::DeviceType device_type);
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
}  // namespace at::autocast

namespace kiln::guards {
namespace {

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
  bool ProvesExactTuple() const override { return type_ == &PyTuple_Type; }

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

// ("dict_keys", keys): the value is a dict whose keys, in the order iterating it yields them, are
// `keys`. An exact dict is read in its own order; a subclass in the order iter(value) yields,
// which for an OrderedDict is kept apart from the dict under it (move_to_end reorders the one,
// not the other, and leaves the dict's version tag as it was).
class DictKeysCheck : public LeafCheck {
 public:
  DictKeysCheck(PyObject* keys, std::string description)  // keys: a tuple
      : LeafCheck(std::move(description), kContainer), keys_(Py_NewRef(keys)) {}
  ~DictKeysCheck() override { Py_DECREF(keys_); }
  // Node::Run skips checks on exact dicts only, whose order the version tag does follow.
  Stability stability() const override { return Stability::kSameDict; }

  bool Run(PyObject* value, std::string* why) const override {
    if (!PyDict_Check(value)) {
      if (why) *why = "expected a dict, got " + TypeName(Py_TYPE(value));
      return false;
    }
    const int match =
        PyDict_CheckExact(value) ? MatchDictOrder(value, why) : MatchIterationOrder(value, why);
    if (match == 0 && why) {
      PyObject* actual = PySequence_Tuple(value);
      if (actual == nullptr) PyErr_Clear();
      *why = "expected keys " + Repr(keys_) + ", got " + (actual ? Repr(actual) : "?");
      Py_XDECREF(actual);
    }
    return match == 1;
  }

 private:
  // The Match functions return 1 when the keys are `keys_` in order, 0 when they are not, and -1
  // (with *why set when `why` is not null, and no exception left set) when reading them raised.

  // An exact dict's keys in its own order, without running Python code but a key's __eq__.
  int MatchDictOrder(PyObject* dict, std::string* why) const {
    const Py_ssize_t n = PyTuple_GET_SIZE(keys_);
    if (PyDict_GET_SIZE(dict) != n) return 0;
    Py_ssize_t pos = 0;
    Py_ssize_t i = 0;
    PyObject* key;
    PyObject* unused;
    for (; i < n && PyDict_Next(dict, &pos, &key, &unused); ++i) {
      PyObject* expected = PyTuple_GET_ITEM(keys_, i);
      if (key == expected) continue;  // interned names: the usual case
      Py_INCREF(key);                 // __eq__ may run Python code that mutates the dict
      const int eq = KeysEqual(key, expected, why);
      Py_DECREF(key);
      if (eq != 1) return eq;
    }
    // An __eq__ that added or removed keys leaves the dict other than it was compared.
    return i == n && PyDict_GET_SIZE(dict) == n ? 1 : 0;
  }

  // A subclass's keys in the order iter(dict) yields them, which may run Python code (a
  // subclass's __iter__; an OrderedDict's own iterator raises when the dict changes under it).
  int MatchIterationOrder(PyObject* dict, std::string* why) const {
    PyObject* it = PyObject_GetIter(dict);
    if (it == nullptr) return Raised("iterating the keys", why);
    const Py_ssize_t n = PyTuple_GET_SIZE(keys_);
    Py_ssize_t i = 0;
    int match = 1;
    while (match == 1) {
      PyObject* key = PyIter_Next(it);
      if (key == nullptr) {
        if (PyErr_Occurred()) {
          match = Raised("iterating the keys", why);
        } else if (i != n) {
          match = 0;  // fewer keys than expected
        }
        break;
      }
      if (i == n) {
        match = 0;  // more keys than expected
      } else {
        PyObject* expected = PyTuple_GET_ITEM(keys_, i++);
        match = key == expected ? 1 : KeysEqual(key, expected, why);
      }
      Py_DECREF(key);
    }
    Py_DECREF(it);
    return match;
  }

  // 1 when `key` (a reference the caller holds) equals `expected` and is of its type (1, 1.0 and
  // True are one dict key, but a trace that read the key saw one of them), 0 when not, -1 when
  // __hash__ or __eq__ raised. Hashes are compared first, as a dict compares keys: two distinct
  // objects hashed by identity (tensors, modules) are distinct keys, never asked __eq__ (a
  // tensor's compares values).
  static int KeysEqual(PyObject* key, PyObject* expected, std::string* why) {
    if (Py_TYPE(key) != Py_TYPE(expected)) return 0;
    const Py_hash_t key_hash = PyObject_Hash(key);
    if (key_hash == -1) return Raised("hashing a key", why);
    const Py_hash_t expected_hash = PyObject_Hash(expected);
    if (expected_hash == -1) return Raised("hashing a key", why);
    if (key_hash != expected_hash) return 0;
    const int eq = PyObject_RichCompareBool(key, expected, Py_EQ);
    return eq < 0 ? Raised("comparing keys", why) : eq;
  }

  static int Raised(const char* what, std::string* why) {
    std::string error = TakeError(why != nullptr);
    if (why) *why = std::string(what) + " raised " + error;
    return -1;
  }

  PyObject* keys_;
};

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
  // Fails when `example` is not a tensor or has symbolic sizes. `sizes` and `strides` (tuples of
  // ints and Nones, or null for the example's own) are what the check compares; a None is a
  // dimension it leaves to the SHAPE guard (a symbolic size).
  static StatusOr<std::unique_ptr<TensorCheck>> Create(PyObject* example, PyObject* sizes,
                                                       PyObject* strides,
                                                       std::string description) {
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
      if (sizes != nullptr) {
        KILN_RETURN_IF_ERROR(Dims(sizes, "sizes", &check->sizes_));
        KILN_RETURN_IF_ERROR(Dims(strides, "strides", &check->strides_));
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

  // Replaces *out (the example's own, of the same rank) with a tuple of ints and Nones.
  static Status Dims(PyObject* dims, const char* what, std::vector<int64_t>* out) {
    if (!PyTuple_Check(dims) || static_cast<size_t>(PyTuple_GET_SIZE(dims)) != out->size()) {
      return Status::InvalidArgument(std::string("('tensor', example, sizes, strides): ") + what +
                                     " must be a tuple of the example's rank, got " + Repr(dims));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dims); ++i) {
      PyObject* d = PyTuple_GET_ITEM(dims, i);
      if (d == Py_None) {
        (*out)[i] = kAnyDim;
        continue;
      }
      const int64_t v = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
      if (v < 0) {
        PyErr_Clear();
        return Status::InvalidArgument(std::string("('tensor', example, sizes, strides): ") +
                                       what + " holds ints >= 0 and Nones, got " + Repr(dims));
      }
      (*out)[i] = v;
    }
    return Status::OK();
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
      if (expected[i] == kAnyDim) continue;  // the SHAPE guard's
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

  // A dimension (size or stride) this check leaves to the SHAPE guard.
  static constexpr int64_t kAnyDim = -1;

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

}  // namespace

std::unique_ptr<LeafCheck> MakeTypeCheck(PyTypeObject* type, std::string description) {
  return std::make_unique<TypeCheck>(type, std::move(description));
}

std::unique_ptr<LeafCheck> MakeIdCheck(PyObject* object, PyObject* on_dead,
                                       std::string description) {
  return std::make_unique<IdCheck>(object, on_dead, std::move(description));
}

bool ConstantCheckSupports(PyObject* value) { return ConstantCheck::Supports(value); }

std::unique_ptr<LeafCheck> MakeConstantCheck(PyObject* value, std::string description) {
  return std::make_unique<ConstantCheck>(value, std::move(description));
}

std::unique_ptr<LeafCheck> MakeLenCheck(Py_ssize_t length, std::string description) {
  return std::make_unique<LenCheck>(length, std::move(description));
}

std::unique_ptr<LeafCheck> MakeDictKeysCheck(PyObject* keys, std::string description) {
  return std::make_unique<DictKeysCheck>(keys, std::move(description));
}

StatusOr<std::unique_ptr<LeafCheck>> MakeTensorCheck(PyObject* example, PyObject* sizes,
                                                     PyObject* strides, std::string description) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TensorCheck> tensor,
                        TensorCheck::Create(example, sizes, strides, std::move(description)));
  return tensor;
}

std::unique_ptr<LeafCheck> MakeHasAttrCheck(PyObject* name, bool present, std::string description) {
  return std::make_unique<HasAttrCheck>(name, present, std::move(description));
}

std::unique_ptr<LeafCheck> MakeNoItemCheck(PyObject* key, std::string description) {
  return std::make_unique<NoItemCheck>(key, std::move(description));
}

std::unique_ptr<LeafCheck> MakeAliasCheck(std::vector<Accessor> other, std::string description) {
  return std::make_unique<AliasCheck>(std::move(other), std::move(description));
}

std::unique_ptr<LeafCheck> MakeDistinctCheck(std::vector<std::vector<Accessor>> sources,
                                             std::string description) {
  return std::make_unique<DistinctCheck>(std::move(sources), std::move(description));
}

std::unique_ptr<LeafCheck> MakeGlobalStateCheck(std::string description) {
  return std::make_unique<GlobalStateCheck>(std::move(description));
}

}  // namespace kiln::guards
