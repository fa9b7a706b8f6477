// Sources, one step at a time: an Accessor reads one step of a guard's source (an argument slot,
// a global, an attribute, an item...) from its parent value, and ReadPath a whole source.
#ifndef KILN_GUARDS_GUARD_ACCESSORS_H_
#define KILN_GUARDS_GUARD_ACCESSORS_H_

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::guards {

// What one evaluation reads from the frame about to run.
struct Frame {
  PyObject* const* slots;
  Py_ssize_t nslots;
  PyFunctionObject* func;  // null when the caller gave no function object
};

// The kinds of step, one per source form of guard_tree.h; kRoot is the frame itself.
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
  kDictItem,  // a dict's (or a dict subclass's) own storage, never its Python __getitem__
  kType,
  kWeakRef,  // what a weakref.ref refers to (None once it died): calling it
};

// One step of a source, from a parent value (or the frame, at the root) to a child.
class Accessor {
 public:
  Accessor() = default;
  // Takes ownership of `arg` (a new reference, or null).
  Accessor(Access kind, Py_ssize_t index, PyObject* arg);
  Accessor(Accessor&& other) noexcept
      : kind_(other.kind_), index_(other.index_), int_key_(other.int_key_), arg_(other.arg_) {
    other.arg_ = nullptr;
  }
  Accessor& operator=(Accessor&&) = delete;
  ~Accessor() { Py_XDECREF(arg_); }

  // Whether two accessors read the same child, so that their nodes merge.
  bool SameAs(const Accessor& other) const;

  // Returns a new reference to the child of `parent`, or null (no exception set, *why set when
  // `why` is not null) when it cannot be read.
  PyObject* Read(PyObject* parent, const Frame& frame, std::string* why) const;

  Access kind() const { return kind_; }

  // How failure reasons name this step.
  std::string Name() const;

 private:
  // container[arg_]; exact dicts (globals, builtins, __dict__, module registries), and any dict
  // a kDictItem step reads, skip PyObject_GetItem, and a missing key of one fails without
  // creating a KeyError.
  PyObject* ReadKey(PyObject* container, std::string* why) const;

  void Failed(std::string* why) const;

  Access kind_ = Access::kRoot;
  Py_ssize_t index_ = 0;     // slot or cell index, or the value of an int item key
  bool int_key_ = false;     // kItem: arg_ is an int, held in index_ too
  PyObject* arg_ = nullptr;  // owned: a name, key or fixed object
};

// Reads a whole source (its accessors, root first) from the frame: a new reference, or null with
// no exception set (and *why set when `why` is not null).
PyObject* ReadPath(const std::vector<Accessor>& path, const Frame& frame, std::string* why);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_ACCESSORS_H_
