// The guard tree: the guards of one compiled entry, merged by source into a tree and evaluated in
// C++ before every reuse of that entry. Python builds it as kiln._C.GuardManager.
#ifndef KILN_GUARDS_GUARD_TREE_H_
#define KILN_GUARDS_GUARD_TREE_H_

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "status.h"

namespace kiln::guards {

class Node;

// A guard is (source, check). A source says where a value lives relative to the frame about to
// run, as nested tuples whose parent is always the second element:
//
//   ("local", i)               argument slot i of the frame
//   ("global", name)           func.__globals__[name]; a missing name fails
//   ("builtin", name)          func.__builtins__[name]
//   ("closure", i)             func.__closure__[i].cell_contents; an empty cell fails
//   ("object", obj)            obj itself; the tree holds a strong reference
//   ("attr", parent, name)     getattr(parent, name)
//   ("instance_dict", parent)  parent.__dict__, read from the object without descriptors
//   ("item", parent, key)      parent[key]
//   ("dict_item", parent, key) dict.__getitem__(parent, key): a dict's (or dict subclass's) own
//                              storage, never a Python __getitem__ of its class
//   ("type", parent)           type(parent)
//   ("weakref", parent)        parent(): what a weakref.ref (exactly) refers to, None once dead
//
// A check says what must hold of that value:
//
//   ("type", t)            type(x) is t
//   ("id", obj)            x is obj. An obj that supports weak references is held weakly when the
//                          tree has an on_dead callable (see the constructor): its death fails
//                          the check and calls on_dead. Otherwise obj is kept alive, so that its
//                          id cannot be reused.
//   ("constant", v)        type(x) is type(v) and x == v, for None, bool, int, float, complex, str,
//                          bytes, torch.dtype/device/layout/memory_format. Floats compare NaN equal
//                          to NaN and -0.0 unequal to 0.0: either difference changes what a
//                          traced graph computes.
//   ("len", n)             x is a list, tuple or dict (or a subclass, such as torch.Size, measured
//                          by its C-level size) and len(x) == n
//   ("dict_keys", keys)    x is a dict (or a subclass) whose keys, in the order iterating x yields
//                          them, equal the tuple `keys`: an exact dict's own order, a subclass's
//                          iter(x) (an OrderedDict's order, which move_to_end changes without
//                          reordering the dict under it). Keys compare as a dict compares them,
//                          by identity or by type, hash and == (two tensors equal in value are
//                          two keys). It does not tell a dict from an OrderedDict: pair it with
//                          ("type", t).
//   ("tensor", example)    TENSOR_MATCH: x has the example's exact Python type, dispatch keys (as
//                          adjusted by the thread's included/excluded keys), dtype, device,
//                          requires_grad, sizes and strides. The example is not kept alive.
//   ("tensor", example, sizes, strides)
//                          the same, comparing `sizes` and `strides` (tuples of ints and Nones of
//                          the example's rank) instead of the example's: a None is a symbolic
//                          dimension, which the SHAPE guard checks.
//   ("shape", sources, bindings, constraints)
//                          relations over sizes, strides, storage offsets and ints read from the
//                          frame (guard_shape.h): every constraint must hold. Its own source is
//                          ignored, as for global_state.
//   ("has_attr", name)     hasattr(x, name); ("no_attr", name): not hasattr(x, name). Looked up as
//                          getattr does: class attributes and __getattr__ count, and an error
//                          other than AttributeError fails the check.
//   ("no_item", key)       x is a dict (or a subclass) without the key `key`
//   ("is", source)         x is the object at another source of the same frame
//   ("distinct", sources)  the objects at these sources (a tuple of two or more) are pairwise not
//                          the same object. Like global_state it reads no one value: its own
//                          source is ignored.
//   ("global_state",)      torch's global state now equals its state when the check was added:
//                          grad mode, default dtype, deterministic algorithms (and warn-only),
//                          TF32 for cuBLAS and cuDNN, autocast for CPU and CUDA. Its source is
//                          ignored (any tuple, or None): it reads no value, so it passes even for a
//                          frame without the slot a placeholder source such as ("local", 0) names.
//
// Within a node cheap checks run before tensor checks, and a node's checks run before its
// children are read, so a type check on L['self'] protects the attribute reads below it. Children
// that fail often move towards the front of their node. A node whose value is exactly a dict
// skips, while the dict's version tag is the one it last passed with, the checks that only its
// contents decide (its keys and length; the identity and constant checks of its items): a module's
// constants and parameters cost one comparison until the module changes. A dict subclass is
// checked in full every time: its __getitem__ may answer otherwise, and an OrderedDict's order is
// not followed by its version tag.
//
// Not thread-safe beyond what the GIL gives: every method must be called with the GIL held.
class GuardTree {
 public:
  // `on_dead` (a callable, or null; the tree holds a reference) is the callback of the weak
  // references ("id", obj) checks hold: it is called with the dead weak reference, at whatever
  // moment the object dies (garbage collection included), so it must only do what is safe then.
  explicit GuardTree(PyObject* on_dead = nullptr);
  ~GuardTree();
  GuardTree(const GuardTree&) = delete;
  GuardTree& operator=(const GuardTree&) = delete;

  // Adds one guard. kInvalidArgument (leaving the tree unchanged and no Python exception set)
  // when `source` or `check` is malformed, or when called while the tree is being evaluated
  // (from a property a guard reads).
  Status Add(PyObject* source, PyObject* check, std::string description);

  // Evaluates every guard against a frame: `slots` are its argument slots, `func` its function
  // object (null or not a function: global, builtin and closure sources fail). Returns true when
  // all pass. Never leaves a Python exception set and never throws. When `why` is not null and a
  // guard fails, *why gets the failing guard's description and the reason.
  bool Check(PyObject* const* slots, Py_ssize_t nslots, PyObject* func, std::string* why);

  // The descriptions of all checks, depth first in the tree's current order.
  std::vector<std::string> Describe() const;

  // The number of checks.
  size_t size() const { return num_checks_; }

 private:
  std::unique_ptr<Node> root_;
  PyObject* on_dead_;  // owned, or null
  size_t num_checks_ = 0;
  bool prepared_ = false;  // the nodes' fast-path flags are current (see Node::Prepare)
  // Evaluations in progress on this tree: a guard reading a property runs Python code, which may
  // release the GIL or evaluate this tree again. Children are reordered only by the sole one.
  int active_ = 0;
};

// Registers kiln._C.GuardManager (the Python face of GuardTree) on `m`.
void RegisterPython(pybind11::module_& m);

}  // namespace kiln::guards

#endif  // KILN_GUARDS_GUARD_TREE_H_
