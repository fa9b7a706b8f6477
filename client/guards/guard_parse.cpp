// Parsing a guard's Python tuples (guard_tree.h lists their forms): a source into its accessors,
// a check into a LeafCheck. A malformed tuple is kInvalidArgument, never a Python exception.
#include "guards/guard_parse.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "guards/guard_reasons.h"
#include "guards/guard_shape.h"

namespace kiln::guards {
namespace {

// Sources nest one tuple per step; deeper than this is a malformed (or cyclic-looking) source.
constexpr int kMaxSourceDepth = 64;

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

// Appends the accessors of `source`, `depth` steps below the guard's own, to *path, root first.
Status ParseSourceAt(PyObject* source, int depth, std::vector<Accessor>* path) {
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
    KILN_RETURN_IF_ERROR(ParseSourceAt(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    InternedName(PyTuple_GET_ITEM(source, 2), &name);
    path->emplace_back(Access::kAttr, 0, name);
    return Status::OK();
  }
  if (KindIs(kind, "item") || KindIs(kind, "dict_item")) {
    const bool item = KindIs(kind, "item");
    KILN_RETURN_IF_ERROR(Arity(source, 3, item ? "('item', parent, key)"
                                               : "('dict_item', parent, key)"));
    KILN_RETURN_IF_ERROR(ParseSourceAt(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    path->emplace_back(item ? Access::kItem : Access::kDictItem, 0,
                       Py_NewRef(PyTuple_GET_ITEM(source, 2)));
    return Status::OK();
  }
  if (KindIs(kind, "instance_dict") || KindIs(kind, "type") || KindIs(kind, "weakref")) {
    const Access access = KindIs(kind, "instance_dict") ? Access::kInstanceDict
                          : KindIs(kind, "type")        ? Access::kType
                                                        : Access::kWeakRef;
    const std::string form = "('" + std::string(kind) + "', parent)";
    KILN_RETURN_IF_ERROR(Arity(source, 2, form.c_str()));
    KILN_RETURN_IF_ERROR(ParseSourceAt(PyTuple_GET_ITEM(source, 1), depth + 1, path));
    path->emplace_back(access, 0, nullptr);
    return Status::OK();
  }
  return Invalid(
      "unknown source kind '" + std::string(kind) +
      "' (expected local, global, builtin, closure, object, attr, instance_dict, item, "
      "dict_item, type or weakref)");
}

}  // namespace

Status ParseSource(PyObject* source, std::vector<Accessor>* path) {
  return ParseSourceAt(source, 0, path);
}

StatusOr<std::unique_ptr<LeafCheck>> ParseCheck(PyObject* check, PyObject* on_dead,
                                                std::string description) {
  std::string_view kind;
  KILN_RETURN_IF_ERROR(TupleKind(check, "a check", &kind));
  if (KindIs(kind, "global_state")) {
    KILN_RETURN_IF_ERROR(Arity(check, 1, "('global_state',)"));
    return MakeGlobalStateCheck(std::move(description));
  }
  if (KindIs(kind, "type")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('type', t)"));
    PyObject* type = PyTuple_GET_ITEM(check, 1);
    if (!PyType_Check(type)) {
      return Invalid("('type', t) needs a type, got " + Repr(type));
    }
    return MakeTypeCheck(reinterpret_cast<PyTypeObject*>(type), std::move(description));
  }
  if (KindIs(kind, "id")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('id', obj)"));
    return MakeIdCheck(PyTuple_GET_ITEM(check, 1), on_dead, std::move(description));
  }
  if (KindIs(kind, "constant")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('constant', value)"));
    PyObject* value = PyTuple_GET_ITEM(check, 1);
    if (!ConstantCheckSupports(value)) {
      return Invalid(
          "('constant', value) supports None, bool, int, float, complex, str, bytes and "
          "torch.dtype/device/layout/memory_format, got " +
          TypeName(Py_TYPE(value)) + "; guard it with ('id', obj) or ('type', t)");
    }
    return MakeConstantCheck(value, std::move(description));
  }
  if (KindIs(kind, "len")) {
    Py_ssize_t length = 0;
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('len', n)"));
    if (!Index(PyTuple_GET_ITEM(check, 1), &length)) {
      return Invalid("('len', n) needs an int n >= 0, got " + Repr(check));
    }
    return MakeLenCheck(length, std::move(description));
  }
  if (KindIs(kind, "dict_keys")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('dict_keys', keys)"));
    PyObject* keys = PyTuple_GET_ITEM(check, 1);
    if (!PyTuple_Check(keys)) {
      return Invalid("('dict_keys', keys) needs a tuple of keys, got " + Repr(keys));
    }
    return MakeDictKeysCheck(keys, std::move(description));
  }
  if (KindIs(kind, "tensor")) {
    if (PyTuple_GET_SIZE(check) == 4) {
      return MakeTensorCheck(PyTuple_GET_ITEM(check, 1), PyTuple_GET_ITEM(check, 2),
                             PyTuple_GET_ITEM(check, 3), std::move(description));
    }
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('tensor', example)"));
    return MakeTensorCheck(PyTuple_GET_ITEM(check, 1), nullptr, nullptr, std::move(description));
  }
  if (KindIs(kind, "shape")) {
    KILN_RETURN_IF_ERROR(Arity(check, 4, "('shape', sources, bindings, constraints)"));
    return MakeShapeCheck(PyTuple_GET_ITEM(check, 1), PyTuple_GET_ITEM(check, 2),
                          PyTuple_GET_ITEM(check, 3), std::move(description));
  }
  if (KindIs(kind, "has_attr") || KindIs(kind, "no_attr")) {
    const bool present = KindIs(kind, "has_attr");
    const char* form = present ? "('has_attr', name)" : "('no_attr', name)";
    PyObject* name = nullptr;
    KILN_RETURN_IF_ERROR(Arity(check, 2, form));
    if (!InternedName(PyTuple_GET_ITEM(check, 1), &name)) {
      return Invalid(std::string(form) + " needs a str name, got " + Repr(check));
    }
    return MakeHasAttrCheck(name, present, std::move(description));
  }
  if (KindIs(kind, "no_item")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('no_item', key)"));
    PyObject* key = PyTuple_GET_ITEM(check, 1);
    if (PyObject_Hash(key) == -1) {
      return Invalid("('no_item', key) needs a hashable key: " + TakeError(true));
    }
    return MakeNoItemCheck(Py_NewRef(key), std::move(description));
  }
  if (KindIs(kind, "is")) {
    KILN_RETURN_IF_ERROR(Arity(check, 2, "('is', source)"));
    std::vector<Accessor> other;
    KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(check, 1), &other));
    return MakeAliasCheck(std::move(other), std::move(description));
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
      KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(sources, i), &paths[i]));
    }
    return MakeDistinctCheck(std::move(paths), std::move(description));
  }
  return Invalid(
      "unknown check kind '" + std::string(kind) +
      "' (expected type, id, constant, len, dict_keys, tensor, shape, has_attr, no_attr, "
      "no_item, is, distinct or global_state)");
}

}  // namespace kiln::guards
