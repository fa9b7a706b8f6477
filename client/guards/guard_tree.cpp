// The guard tree: nodes merged by source, their evaluation and its fast path over unchanged dicts,
// the C interface the frame hook calls, and the Python class kiln._C.GuardManager.
#include "guards/guard_tree.h"

#include <torch/csrc/jit/frontend/tracer.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "guards/guard_accessors.h"
#include "guards/guard_api.h"
#include "guards/guard_checks.h"
#include "guards/guard_parse.h"
#include "python_status.h"

namespace kiln::guards {
namespace {

PyObject* const* TupleItems(PyObject* tuple) {
  return reinterpret_cast<PyTupleObject*>(tuple)->ob_item;
}

struct Eval {
  Frame frame;
  std::string* why;   // null on the hot path: reasons are built only when asked for
  const int* active;  // the tree's count of evaluations in progress
};

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
      tuple = tuple || check->ProvesExactTuple();
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
    // Exact dicts only: a subclass's __getitem__ may answer otherwise for the same contents, and
    // an OrderedDict keeps its order apart from the dict under it (move_to_end reorders its keys
    // and leaves the version tag as it was), so that its keys must be compared every time.
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
    KILN_RETURN_IF_ERROR(ParseSource(source, &path));
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
