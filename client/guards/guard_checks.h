// The guard tree's leaf checks: what must hold of one value (its type, identity, constant value,
// length, dict keys, tensor metadata, attributes, items) or of the frame as a whole.
#ifndef KILN_GUARDS_GUARD_CHECKS_H_
#define KILN_GUARDS_GUARD_CHECKS_H_

#include <Python.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "guards/guard_accessors.h"
#include "status.h"

namespace kiln::guards {

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
  // Whether passing proves the value is exactly a tuple: immutable, so that its length and items
  // are decided by the object too.
  virtual bool ProvesExactTuple() const { return false; }

  // What keeps a check's last answer valid (see Node::Run's fast path): kSameObject, the value
  // is the same object as then (its identity, or an immutable constant, decides the answer);
  // kSameDict, the value is an exact dict with the same version tag as then (its keys or length
  // decide it; Node::Run never skips checks on a subclass, since the tag does not follow an
  // OrderedDict's order); kNothing, the check must run again.
  enum class Stability { kNothing, kSameObject, kSameDict };
  virtual Stability stability() const { return Stability::kNothing; }

  const std::string& description() const { return description_; }
  Cost cost() const { return cost_; }

 private:
  std::string description_;
  Cost cost_;
};

// The checks of guard_tree.h, one factory each. Arguments are borrowed unless a factory says it
// takes them; the check holds what it needs.

// ("type", t)
std::unique_ptr<LeafCheck> MakeTypeCheck(PyTypeObject* type, std::string description);
// ("id", obj). With `on_dead` (a callable, or null) and an object that supports weak references,
// the check holds a weak reference whose callback is `on_dead`; otherwise it holds the object.
std::unique_ptr<LeafCheck> MakeIdCheck(PyObject* object, PyObject* on_dead,
                                       std::string description);
// Whether ("constant", value) is supported for a value of this type.
bool ConstantCheckSupports(PyObject* value);
// ("constant", value), for a value ConstantCheckSupports.
std::unique_ptr<LeafCheck> MakeConstantCheck(PyObject* value, std::string description);
// ("len", n)
std::unique_ptr<LeafCheck> MakeLenCheck(Py_ssize_t length, std::string description);
// ("dict_keys", keys), keys a tuple.
std::unique_ptr<LeafCheck> MakeDictKeysCheck(PyObject* keys, std::string description);
// ("tensor", example) with `sizes` and `strides` null, or ("tensor", example, sizes, strides).
// kInvalidArgument when `example` is not a defined tensor with concrete sizes and strides, or
// sizes/strides are not tuples of its rank of ints >= 0 and Nones.
StatusOr<std::unique_ptr<LeafCheck>> MakeTensorCheck(PyObject* example, PyObject* sizes,
                                                     PyObject* strides, std::string description);

// ("has_attr", name) when `present`, else ("no_attr", name). Takes `name`, an interned str.
std::unique_ptr<LeafCheck> MakeHasAttrCheck(PyObject* name, bool present, std::string description);
// ("no_item", key). Takes `key`.
std::unique_ptr<LeafCheck> MakeNoItemCheck(PyObject* key, std::string description);
// ("is", source): `other` is the parsed source.
std::unique_ptr<LeafCheck> MakeAliasCheck(std::vector<Accessor> other, std::string description);
// ("distinct", sources): `sources` are the parsed sources.
std::unique_ptr<LeafCheck> MakeDistinctCheck(std::vector<std::vector<Accessor>> sources,
                                             std::string description);
// ("global_state",): torch's global state as it is now.
std::unique_ptr<LeafCheck> MakeGlobalStateCheck(std::string description);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_CHECKS_H_
