// The SHAPE guard (guard_shape.h): expressions parsed once into a flat node array, evaluated per
// call over the symbols' values read from the frame.
#include "guards/guard_shape.h"

#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "guards/guard_accessors.h"
#include "guards/guard_parse.h"
#include "guards/guard_reasons.h"

namespace kiln::guards {
namespace {

enum class Op : uint8_t {
  kConst, kSym, kAdd, kMul, kPow, kFloorDiv, kCeilDiv, kMod, kMax, kMin,
  kEq, kNe, kLt, kLe, kGt, kGe, kAnd, kOr, kNot,
};

struct OpName {
  const char* name;
  Op op;
  int min_args;
  int max_args;  // -1: any number >= min_args
};

constexpr OpName kOps[] = {
    {"add", Op::kAdd, 2, -1},     {"mul", Op::kMul, 2, -1},    {"pow", Op::kPow, 2, 2},
    {"floordiv", Op::kFloorDiv, 2, 2}, {"ceildiv", Op::kCeilDiv, 2, 2}, {"mod", Op::kMod, 2, 2},
    {"max", Op::kMax, 2, -1},     {"min", Op::kMin, 2, -1},    {"eq", Op::kEq, 2, 2},
    {"ne", Op::kNe, 2, 2},        {"lt", Op::kLt, 2, 2},       {"le", Op::kLe, 2, 2},
    {"gt", Op::kGt, 2, 2},        {"ge", Op::kGe, 2, 2},       {"and", Op::kAnd, 1, -1},
    {"or", Op::kOr, 1, -1},       {"not", Op::kNot, 1, 1},
};

// Expressions nest one tuple per operation; deeper than this is malformed.
constexpr int kMaxDepth = 256;

struct ExprNode {
  Op op;
  int64_t value;           // kConst: the constant; kSym: the symbol's index
  std::vector<int> args;   // indices into the node array
};

enum class Kind : uint8_t { kSize, kStride, kOffset, kInt };

struct Binding {
  size_t source;
  Kind kind;
  int64_t dim;
  std::string name;
};

Status Invalid(std::string message) { return Status::InvalidArgument(std::move(message)); }

class ShapeCheck : public LeafCheck {
 public:
  explicit ShapeCheck(std::string description) : LeafCheck(std::move(description), kTensor) {}

  Status Parse(PyObject* sources, PyObject* bindings, PyObject* constraints) {
    if (!PyTuple_Check(sources) || !PyTuple_Check(bindings) || !PyTuple_Check(constraints)) {
      return Invalid("('shape', sources, bindings, constraints) needs three tuples");
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sources); ++i) {
      sources_.emplace_back();
      KILN_RETURN_IF_ERROR(ParseSource(PyTuple_GET_ITEM(sources, i), &sources_.back()));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bindings); ++i) {
      KILN_RETURN_IF_ERROR(ParseBinding(PyTuple_GET_ITEM(bindings, i)));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(constraints); ++i) {
      PyObject* c = PyTuple_GET_ITEM(constraints, i);
      if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 2 ||
          !PyUnicode_Check(PyTuple_GET_ITEM(c, 1))) {
        return Invalid("a shape constraint is (expr, text), got " + Repr(c));
      }
      int root = 0;
      KILN_RETURN_IF_ERROR(ParseExpr(PyTuple_GET_ITEM(c, 0), 0, &root));
      const char* text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(c, 1));
      if (text == nullptr) return Invalid("a shape constraint's text: " + TakeError(true));
      constraints_.emplace_back(root, text);
    }
    return Status::OK();
  }

  bool ReadsValue() const override { return false; }

  bool Run(PyObject* /*value*/, std::string* why) const override {
    if (why) *why = "needs the frame";
    return false;
  }

  bool RunIn(PyObject* /*value*/, const Frame& frame, std::string* why) const override {
    constexpr size_t kSmall = 16;
    int64_t small[kSmall];
    std::vector<int64_t> large;
    int64_t* values = small;
    if (bindings_.size() > kSmall) {
      large.resize(bindings_.size());
      values = large.data();
    }
    if (!ReadBindings(frame, values, why)) return false;
    for (const auto& [root, text] : constraints_) {
      int64_t result = 0;
      if (Eval(root, values, &result) && result != 0) continue;
      if (why) {
        *why = text + " does not hold (";
        for (size_t i = 0; i < bindings_.size(); ++i) {
          if (i) *why += ", ";
          *why += bindings_[i].name + " = " + std::to_string(values[i]);
        }
        *why += ")";
      }
      return false;
    }
    return true;
  }

 private:
  Status ParseBinding(PyObject* b) {
    if (!PyTuple_Check(b) || PyTuple_GET_SIZE(b) != 4 || !PyLong_CheckExact(PyTuple_GET_ITEM(b, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(b, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(b, 2)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(b, 3))) {
      return Invalid("a shape binding is (source index, kind, dim, name), got " + Repr(b));
    }
    Binding binding;
    const long long source = PyLong_AsLongLong(PyTuple_GET_ITEM(b, 0));
    binding.dim = PyLong_AsLongLong(PyTuple_GET_ITEM(b, 2));
    if (PyErr_Occurred() || source < 0 || static_cast<size_t>(source) >= sources_.size() ||
        binding.dim < 0) {
      PyErr_Clear();
      return Invalid("a shape binding's source index or dim is out of range: " + Repr(b));
    }
    binding.source = static_cast<size_t>(source);
    const char* kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(b, 1));
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(b, 3));
    if (kind == nullptr || name == nullptr) return Invalid("a shape binding: " + TakeError(true));
    const std::string_view k(kind);
    if (k == "size") {
      binding.kind = Kind::kSize;
    } else if (k == "stride") {
      binding.kind = Kind::kStride;
    } else if (k == "storage_offset") {
      binding.kind = Kind::kOffset;
    } else if (k == "int") {
      binding.kind = Kind::kInt;
    } else {
      return Invalid("a shape binding's kind is size, stride, storage_offset or int, got " +
                     Repr(b));
    }
    binding.name = name;
    bindings_.push_back(std::move(binding));
    return Status::OK();
  }

  Status ParseExpr(PyObject* e, int depth, int* index) {
    if (depth > kMaxDepth) return Invalid("a shape expression nests too deep");
    if (PyLong_CheckExact(e)) {
      const long long v = PyLong_AsLongLong(e);
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return Invalid("a shape expression's constant does not fit 64 bits: " + Repr(e));
      }
      return Push(ExprNode{Op::kConst, v, {}}, index);
    }
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(e, 0))) {
      return Invalid("a shape expression is an int or (op, arg...), got " + Repr(e));
    }
    const char* op = PyUnicode_AsUTF8(PyTuple_GET_ITEM(e, 0));
    if (op == nullptr) return Invalid("a shape expression: " + TakeError(true));
    const std::string_view name(op);
    const Py_ssize_t nargs = PyTuple_GET_SIZE(e) - 1;
    if (name == "sym") {
      PyObject* i = PyTuple_GET_ITEM(e, 1);
      const long long slot = PyLong_CheckExact(i) ? PyLong_AsLongLong(i) : -1;
      if (nargs != 1 || slot < 0 || static_cast<size_t>(slot) >= bindings_.size()) {
        PyErr_Clear();
        return Invalid("('sym', i) needs a bound symbol's index, got " + Repr(e));
      }
      return Push(ExprNode{Op::kSym, slot, {}}, index);
    }
    for (const OpName& known : kOps) {
      if (name != known.name) continue;
      if (nargs < known.min_args || (known.max_args >= 0 && nargs > known.max_args)) {
        return Invalid("wrong number of operands in " + Repr(e));
      }
      ExprNode node{known.op, 0, {}};
      for (Py_ssize_t a = 1; a <= nargs; ++a) {
        int child = 0;
        KILN_RETURN_IF_ERROR(ParseExpr(PyTuple_GET_ITEM(e, a), depth + 1, &child));
        node.args.push_back(child);
      }
      if (known.op == Op::kPow && (nodes_[node.args[1]].op != Op::kConst ||
                                   nodes_[node.args[1]].value < 0)) {
        return Invalid("pow needs an int exponent >= 0, got " + Repr(e));
      }
      return Push(std::move(node), index);
    }
    return Invalid("unknown shape operation in " + Repr(e));
  }

  Status Push(ExprNode node, int* index) {
    *index = static_cast<int>(nodes_.size());
    nodes_.push_back(std::move(node));
    return Status::OK();
  }

  bool ReadBindings(const Frame& frame, int64_t* values, std::string* why) const {
    // Each source read once; a few (the usual case) on the stack: this runs on every call.
    constexpr size_t kSmall = 8;
    PyObject* small[kSmall] = {};
    std::vector<PyObject*> large;
    PyObject** read = small;
    if (sources_.size() > kSmall) {
      large.assign(sources_.size(), nullptr);
      read = large.data();
    }
    bool ok = true;
    for (size_t i = 0; ok && i < bindings_.size(); ++i) {
      const Binding& b = bindings_[i];
      PyObject*& value = read[b.source];
      if (value == nullptr) {
        value = ReadPath(sources_[b.source], frame, why);
        if (value == nullptr) {
          ok = false;
          break;
        }
      }
      ok = ReadOne(b, value, &values[i], why);
    }
    for (size_t i = 0; i < sources_.size(); ++i) Py_XDECREF(read[i]);
    return ok;
  }

  static bool ReadOne(const Binding& b, PyObject* value, int64_t* out, std::string* why) {
    if (b.kind == Kind::kInt) {
      if (PyLong_CheckExact(value)) {
        *out = PyLong_AsLongLong(value);
        if (!PyErr_Occurred()) return true;
        PyErr_Clear();
      }
      if (why) *why = b.name + " is not an int of 64 bits";
      return false;
    }
    bool is_tensor = false;
    try {
      is_tensor = THPVariable_Check(value);
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    if (!is_tensor) {
      if (why) *why = b.name + ": not a tensor";
      return false;
    }
    try {
      const at::Tensor& t = THPVariable_Unpack(value);
      std::optional<int64_t> v;
      if (b.kind == Kind::kOffset) {
        v = t.sym_storage_offset().maybe_as_int();
      } else {
        c10::SymIntArrayRef dims = b.kind == Kind::kSize ? t.sym_sizes() : t.sym_strides();
        if (b.dim < static_cast<int64_t>(dims.size())) v = dims[b.dim].maybe_as_int();
      }
      if (v) {
        *out = *v;
        return true;
      }
    } catch (const std::exception& e) {
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (why) *why = b.name + " cannot be read";
    return false;
  }

  // Python's floor division and modulo; false on a zero divisor or overflow.
  static bool FloorDiv(int64_t a, int64_t b, int64_t* out) {
    if (b == 0 || (a == INT64_MIN && b == -1)) return false;
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    *out = q;
    return true;
  }

  bool Eval(int index, const int64_t* values, int64_t* out) const {
    const ExprNode& n = nodes_[index];
    switch (n.op) {
      case Op::kConst:
        *out = n.value;
        return true;
      case Op::kSym:
        *out = values[n.value];
        return true;
      case Op::kAnd:
      case Op::kOr: {
        const bool is_and = n.op == Op::kAnd;
        for (int a : n.args) {
          int64_t v = 0;
          if (!Eval(a, values, &v)) return false;
          if ((v != 0) != is_and) {
            *out = is_and ? 0 : 1;
            return true;
          }
        }
        *out = is_and ? 1 : 0;
        return true;
      }
      case Op::kNot: {
        int64_t v = 0;
        if (!Eval(n.args[0], values, &v)) return false;
        *out = v == 0;
        return true;
      }
      default:
        break;
    }
    int64_t acc = 0;
    if (!Eval(n.args[0], values, &acc)) return false;
    for (size_t i = 1; i < n.args.size(); ++i) {
      int64_t v = 0;
      if (!Eval(n.args[i], values, &v)) return false;
      switch (n.op) {
        case Op::kAdd:
          if (__builtin_add_overflow(acc, v, &acc)) return false;
          break;
        case Op::kMul:
          if (__builtin_mul_overflow(acc, v, &acc)) return false;
          break;
        case Op::kPow: {
          int64_t r = 1;
          for (int64_t k = 0; k < v; ++k) {
            if (__builtin_mul_overflow(r, acc, &r)) return false;
          }
          acc = r;
          break;
        }
        case Op::kFloorDiv:
          if (!FloorDiv(acc, v, &acc)) return false;
          break;
        case Op::kCeilDiv: {
          int64_t neg = 0;
          if (acc == INT64_MIN || !FloorDiv(-acc, v, &neg)) return false;
          acc = -neg;
          break;
        }
        case Op::kMod: {
          int64_t q = 0;
          if (!FloorDiv(acc, v, &q)) return false;
          acc = acc - q * v;
          break;
        }
        case Op::kMax:
          acc = acc > v ? acc : v;
          break;
        case Op::kMin:
          acc = acc < v ? acc : v;
          break;
        case Op::kEq:
          acc = acc == v;
          break;
        case Op::kNe:
          acc = acc != v;
          break;
        case Op::kLt:
          acc = acc < v;
          break;
        case Op::kLe:
          acc = acc <= v;
          break;
        case Op::kGt:
          acc = acc > v;
          break;
        case Op::kGe:
          acc = acc >= v;
          break;
        default:
          return false;
      }
    }
    *out = acc;
    return true;
  }

  std::vector<std::vector<Accessor>> sources_;
  std::vector<Binding> bindings_;
  std::vector<ExprNode> nodes_;
  std::vector<std::pair<int, std::string>> constraints_;  // (root node, text)
};

}  // namespace

StatusOr<std::unique_ptr<LeafCheck>> MakeShapeCheck(PyObject* sources, PyObject* bindings,
                                                    PyObject* constraints,
                                                    std::string description) {
  auto check = std::make_unique<ShapeCheck>(std::move(description));
  KILN_RETURN_IF_ERROR(check->Parse(sources, bindings, constraints));
  return std::unique_ptr<LeafCheck>(std::move(check));
}

}  // namespace kiln::guards
