// Building a Plan (slots, checks of the whole plan, kernel symbols, schema binding) and running
// it: the per-call path of compiled graphs, with no Python on it.
#include "runtime/plan_runtime.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/Scalar.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>

#include "runtime/wire_types.h"

#ifdef KILN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace kiln::runtime {
namespace {

// A plan that cannot be built: every such message starts with "kiln plan: ".
Status Invalid(const std::string& message) {
  return Status::InvalidArgument("kiln plan: " + message);
}

std::string Id(uint32_t id) { return "value " + std::to_string(id); }

std::pair<std::string, std::string> SplitOpName(const std::string& op) {
  const size_t colons = op.find("::");
  const size_t dot = op.find('.', colons == std::string::npos ? 0 : colons + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

// The schema type an argument binds to, with an Optional unwrapped.
struct FormalType {
  c10::TypePtr type;
  bool optional = false;
};

FormalType Unwrap(const c10::Argument& formal) {
  FormalType f{formal.real_type(), false};
  if (auto opt = f.type->cast<c10::OptionalType>()) {
    f.type = opt->getElementType();
    f.optional = true;
  }
  return f;
}

bool IsTensor(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }

bool IsIntLike(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::IntType || t->kind() == c10::TypeKind::SymIntType;
}

bool IsFloatLike(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::FloatType || t->kind() == c10::TypeKind::SymFloatType;
}

// The element type of a list type; null for anything else.
c10::TypePtr ListElement(const c10::TypePtr& t) {
  if (auto list = t->cast<c10::ListType>()) return list->getElementType();
  return nullptr;
}

// A Python number where the schema takes a Tensor (x * 2.0 traced as aten::mul.Tensor): a
// wrapped number, as eager PyTorch makes it, so type promotion treats it as a scalar.
at::Tensor WrappedNumber(const c10::Scalar& value) {
  at::Tensor t = c10::scalar_to_tensor(value);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// The IValue of a non-tensor argument, typed for the schema argument it binds to; an error
// (naming `where`) when the payload cannot take that type.
StatusOr<c10::IValue> ConvertConstant(const CallArg& a, const c10::Argument& formal,
                                      const std::string& where) {
  using K = CallArg::Kind;
  using TK = c10::TypeKind;
  const FormalType f = Unwrap(formal);
  const TK kind = f.type->kind();
  const c10::TypePtr element = ListElement(f.type);
  auto mismatch = [&](const char* payload) {
    return Invalid(where + ": " + payload + " cannot bind to " + formal.real_type()->str());
  };
  auto unknown = [&](const char* what) {
    return Invalid(where + ": " + std::to_string(a.i) + " is not a kiln.v1 " + what);
  };
  switch (a.kind) {
    case K::kNone:
      if (f.optional || kind == TK::NoneType) return c10::IValue();
      // An undefined tensor, as autograd passes one: the backward of attention without a mask
      // (its attn_bias is a Tensor, not a Tensor?), traced as None.
      if (kind == TK::TensorType) return c10::IValue(at::Tensor());
      return mismatch("None");
    case K::kInt:
      if (IsIntLike(f.type)) return c10::IValue(a.i);
      if (IsFloatLike(f.type)) return c10::IValue(static_cast<double>(a.i));
      if (kind == TK::NumberType) return c10::IValue(c10::Scalar(a.i));  // An int Scalar.
      if (kind == TK::TensorType) return c10::IValue(WrappedNumber(c10::Scalar(a.i)));
      if (kind == TK::ScalarTypeType || kind == TK::LayoutType || kind == TK::MemoryFormatType) {
        return c10::IValue(a.i);
      }
      if (element != nullptr && IsIntLike(element) && formal.N()) {
        // int[2] stride given as 2: Python's argument parser repeats it N times.
        return c10::IValue(
            c10::List<int64_t>(std::vector<int64_t>(static_cast<size_t>(*formal.N()), a.i)));
      }
      return mismatch("an int");
    case K::kFloat:
      if (IsFloatLike(f.type)) return c10::IValue(a.f);
      if (kind == TK::NumberType) return c10::IValue(c10::Scalar(a.f));  // A double Scalar.
      if (kind == TK::TensorType) return c10::IValue(WrappedNumber(c10::Scalar(a.f)));
      return mismatch("a float");
    case K::kBool:
      if (kind == TK::BoolType || kind == TK::SymBoolType) return c10::IValue(a.b);
      if (kind == TK::NumberType) return c10::IValue(c10::Scalar(a.b));
      if (kind == TK::TensorType) return c10::IValue(WrappedNumber(c10::Scalar(a.b)));
      return mismatch("a bool");
    case K::kInts:
      if (element != nullptr && IsIntLike(element)) return c10::IValue(c10::List<int64_t>(a.list));
      if (element != nullptr && IsFloatLike(element)) {
        return c10::IValue(c10::List<double>(std::vector<double>(a.list.begin(), a.list.end())));
      }
      if (element != nullptr &&
          (element->kind() == TK::NumberType ||
           (element->kind() == TK::OptionalType &&
            element->castRaw<c10::OptionalType>()->getElementType()->kind() == TK::NumberType))) {
        c10::impl::GenericList scalars(element);  // Scalar[] / Scalar?[] (mkldnn's scalars)
        for (int64_t v : a.list) scalars.push_back(c10::Scalar(v));
        return c10::IValue(scalars);
      }
      if (element != nullptr && element->kind() == TK::BoolType) {
        c10::List<bool> bools;
        for (int64_t v : a.list) bools.push_back(v != 0);
        return c10::IValue(bools);
      }
      return mismatch("an int list");
    case K::kDtype: {
      if (kind != TK::ScalarTypeType && kind != TK::IntType) return mismatch("a dtype");
      const auto dtype = ScalarTypeOf(static_cast<WireDType>(a.i));
      if (!dtype) return unknown("DType");
      return c10::IValue(static_cast<int64_t>(*dtype));  // How IValue holds a ScalarType.
    }
    case K::kLayout: {
      if (kind != TK::LayoutType && kind != TK::IntType) return mismatch("a layout");
      const auto layout = LayoutOf(static_cast<WireLayout>(a.i));
      if (!layout) return unknown("Layout");
      return c10::IValue(static_cast<int64_t>(*layout));
    }
    case K::kMemoryFormat: {
      if (kind != TK::MemoryFormatType && kind != TK::IntType) return mismatch("a memory format");
      const auto format = MemoryFormatOf(static_cast<WireMemoryFormat>(a.i));
      if (!format) return unknown("MemoryFormat");
      return c10::IValue(static_cast<int64_t>(*format));
    }
    case K::kStr:
      if (kind == TK::StringType) return c10::IValue(a.s);
      return mismatch("a str");
    case K::kDevice: {
      if (kind != TK::DeviceObjType) return mismatch("a device");
      const auto device = DeviceOf(a.device);
      if (!device) {
        return Invalid(where + ": bad device (kind " +
                       std::to_string(static_cast<int>(a.device.kind)) + ", index " +
                       std::to_string(a.device.index) + ")");
      }
      return c10::IValue(*device);
    }
    case K::kUnset:
    case K::kValue:
    case K::kValues:
      break;
  }
  return Invalid(where + ": internal: a tensor argument bound as a constant");
}

std::string Ints(c10::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

// Formatted by hand: c10::str of an ArrayRef crashed on the CPython 3.12 + torch 2.11 host.
std::string Describe(at::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return std::string(c10::toString(dtype)) + Ints(sizes) + " strides " + Ints(strides);
}

// Elements of storage a tensor with this metadata reaches (storage offset included). Create
// checked that it and its bytes fit in int64_t for every value of the plan.
int64_t StorageElements(const ValueMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return m.storage_offset;
    extent += (m.sizes[d] - 1) * m.strides[d];
  }
  return m.storage_offset + extent;
}

// StorageElements, or nullopt when it or its bytes overflow int64_t (a plan that would make the
// arena's bounds check wrap around).
std::optional<int64_t> CheckedStorageBytes(const ValueMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) {
      extent = 0;
      break;
    }
    int64_t span = 0;
    if (__builtin_mul_overflow(m.sizes[d] - 1, m.strides[d], &span) ||
        __builtin_add_overflow(extent, span, &extent)) {
      return std::nullopt;
    }
  }
  int64_t elements = 0, bytes = 0;
  if (__builtin_add_overflow(m.storage_offset, extent, &elements) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(c10::elementSize(m.dtype)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

// A new tensor with exactly the metadata's sizes, strides and storage offset.
at::Tensor EmptyWithLayout(const ValueMeta& m, const at::TensorOptions& options) {
  if (m.storage_offset == 0) return at::empty_strided(m.sizes, m.strides, options);
  return at::empty({StorageElements(m)}, options).as_strided(m.sizes, m.strides, m.storage_offset);
}

bool HasLayout(const at::Tensor& t, const ValueMeta& m) {
  return t.strides() == c10::IntArrayRef(m.strides) && t.storage_offset() == m.storage_offset;
}

// A copy of `t` with the metadata's layout (for a `t` that lacks it), of `t`'s dtype or `dtype`.
at::Tensor CopyWithLayout(const at::Tensor& t, const ValueMeta& m,
                          std::optional<at::ScalarType> dtype = std::nullopt) {
  at::Tensor copy = EmptyWithLayout(m, t.options().dtype(dtype.value_or(t.scalar_type())));
  copy.copy_(t);
  return copy;
}

// Whether an argument may be aliased by the op's result (a view: "Tensor(a) self").
// Whether a call draws from the random generator: its op has torch's nondeterministic_seeded
// tag, unless its dropout probability (attention's dropout_p) is a constant 0, as in every
// inference call of scaled_dot_product_attention.
bool DrawsRandomNumbers(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  const auto& formals = op.schema().arguments();
  for (size_t i = 0; i < formals.size() && i < stack.size(); ++i) {
    if (formals[i].name() == "dropout_p" && stack[i].isDouble() && stack[i].toDouble() == 0.0) {
      return false;
    }
  }
  return true;
}

bool MayAlias(const c10::Argument& formal) {
  return formal.alias_info() != nullptr && !formal.alias_info()->isWrite();
}

// The tensor a kiln.v1.Constant holds: its elements are contiguous, little-endian, exactly
// numel * element size bytes.
StatusOr<at::Tensor> ConstantTensor(const ConstantSpec& c) {
  const std::string what = "constant " + Id(c.value.id);
  const auto dtype = ScalarTypeOf(c.value.meta.dtype);
  if (!dtype) return Invalid(what + " has no valid dtype");
  int64_t bytes = static_cast<int64_t>(c10::elementSize(*dtype));
  for (int64_t size : c.value.meta.sizes) {
    if (size < 0 || __builtin_mul_overflow(bytes, size, &bytes)) {
      return Invalid(what + " has a negative or too large size");
    }
  }
  if (static_cast<uint64_t>(bytes) != c.data.size()) {
    return Invalid(what + " has " + std::to_string(c.data.size()) + " bytes, its metadata needs " +
                   std::to_string(bytes));
  }
  at::Tensor t = at::empty(c.value.meta.sizes, at::TensorOptions().dtype(*dtype));
  if (bytes > 0) std::memcpy(t.data_ptr(), c.data.data(), c.data.size());
  return t;
}

}  // namespace

// Create's state while it checks the plan in order: which values are defined, released, buffers,
// written or plan outputs. Every check is here; Run relies on them.
class Plan::Builder {
 public:
  explicit Builder(Plan& plan) : plan_(plan) {}

  Status Build(const PlanSpec& spec, const PlanBinding& binding);

 private:
  enum State : char { kUndefined, kDefined, kReleased };

  Status Values(const PlanSpec& spec);
  StatusOr<int> Slot(uint32_t id) const;
  Status Define(int s, const std::string& where);
  Status Require(int s, const std::string& where) const;
  // Binds a constant or parameter (`what`) once: on the plan's device, in its value's layout.
  Status Bind(uint32_t id, const at::Tensor& tensor, const char* what);
  Status Buffers(const PlanSpec& spec);
  // Loads the kernel binary when a step launches a kernel.
  Status Kernels(const PlanSpec& spec, const PlanBinding& binding);
  Status CudaLaunchOf(const KernelStepSpec& k, const std::string& where, CudaKernel* out) const;
  Status Steps(const std::vector<StepSpec>& specs, const char* list, bool prologue,
               std::vector<Step>* into);
  Status KernelStepOf(const KernelStepSpec& k, bool prologue, Step* step);
  Status LibraryStepOf(const LibraryStepSpec& l, bool prologue, Step* step);
  StatusOr<LibraryStep> BindLibrary(const LibraryStepSpec& spec, const std::string& where) const;
  Status Release(const std::vector<uint32_t>& ids, Step* step);
  Status InputUpdates(const PlanSpec& spec, size_t num_params);

  Plan& plan_;
  std::vector<char> state_, is_buffer_, written_, is_output_;
  std::set<int> watched_;  // Constant slots the prologue reads.
};

Plan::Plan(c10::Device device, uint64_t arena_bytes) : arena_bytes_(arena_bytes), device_(device) {}

Plan::~Plan() = default;

StatusOr<std::unique_ptr<Plan>> Plan::Create(const PlanSpec& spec, PlanBinding binding) {
  std::unique_ptr<Plan> plan(new Plan(binding.device, spec.arena_bytes));
  Status status;
  try {
    status = Builder(*plan).Build(spec, binding);
  } catch (const c10::Error& e) {  // Binding constants: out of memory, a device torch lacks.
    status = Status::RuntimeError(std::string("kiln plan: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    status = Status::RuntimeError(std::string("kiln plan: ") + e.what());
  }
  if (!status.ok()) return status;
  return plan;
}

StatusOr<int> Plan::Builder::Slot(uint32_t id) const {
  auto it = std::lower_bound(plan_.ids_.begin(), plan_.ids_.end(), id);
  if (it == plan_.ids_.end() || *it != id) {
    return Invalid("the plan uses " + Id(id) + " without metadata");
  }
  return static_cast<int>(it - plan_.ids_.begin());
}

Status Plan::Builder::Define(int s, const std::string& where) {
  if (state_[s] != kUndefined) {
    return Invalid(where + ": " + Id(plan_.ids_[s]) + " is defined twice");
  }
  state_[s] = kDefined;
  return Status::OK();
}

Status Plan::Builder::Require(int s, const std::string& where) const {
  if (state_[s] == kReleased) {
    return Invalid(where + ": " + Id(plan_.ids_[s]) + " is used after its release");
  }
  if (state_[s] != kDefined || (is_buffer_[s] && !written_[s])) {
    return Invalid(where + ": " + Id(plan_.ids_[s]) + " is used before it is computed");
  }
  return Status::OK();
}

// Slots: the ids of `values`, sorted, so that Slot() is a binary search at build time only.
Status Plan::Builder::Values(const PlanSpec& spec) {
  std::vector<const ValueSpec*> values;
  values.reserve(spec.values.size());
  for (const ValueSpec& v : spec.values) values.push_back(&v);
  std::sort(values.begin(), values.end(), [](auto* x, auto* y) { return x->id < y->id; });
  for (const ValueSpec* v : values) {
    const std::string what = Id(v->id);
    if (!plan_.ids_.empty() && plan_.ids_.back() == v->id) {
      return Invalid(what + " has metadata twice");
    }
    const auto dtype = ScalarTypeOf(v->meta.dtype);
    if (!dtype) return Invalid(what + " has no valid dtype");
    ValueMeta meta{*dtype, v->meta.sizes, v->meta.strides, v->meta.storage_offset};
    if (meta.sizes.size() != meta.strides.size()) {
      return Invalid(what + ": sizes and strides differ in rank");
    }
    if (std::any_of(meta.sizes.begin(), meta.sizes.end(), [](int64_t x) { return x < 0; }) ||
        std::any_of(meta.strides.begin(), meta.strides.end(), [](int64_t x) { return x < 0; }) ||
        meta.storage_offset < 0) {
      return Invalid(what + " has a negative size, stride or storage offset");
    }
    if (!CheckedStorageBytes(meta)) return Invalid(what + " spans more bytes than int64_t counts");
    plan_.ids_.push_back(v->id);
    plan_.metas_.push_back(std::move(meta));
  }
  const size_t n = plan_.ids_.size();
  plan_.bound_.resize(n);
  plan_.originals_.resize(n);
  plan_.buffers_.resize(n);
  state_.assign(n, kUndefined);
  is_buffer_.assign(n, 0);
  written_.assign(n, 0);
  is_output_.assign(n, 0);
  return Status::OK();
}

Status Plan::Builder::Bind(uint32_t id, const at::Tensor& tensor, const char* what) {
  KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
  const std::string where = std::string(what) + " " + Id(id);
  KILN_RETURN_IF_ERROR(Define(s, what));
  const ValueMeta& m = plan_.metas_[s];
  if (!tensor.defined()) return Invalid(where + " is undefined");
  if (tensor.scalar_type() != m.dtype || tensor.sizes() != c10::IntArrayRef(m.sizes)) {
    return Invalid(where + " is " +
                   Describe(tensor.scalar_type(), tensor.sizes(), tensor.strides()) +
                   ", its metadata says " + Describe(m.dtype, m.sizes, m.strides));
  }
  at::Tensor t = tensor.to(plan_.device_);
  if (!HasLayout(t, m)) t = CopyWithLayout(t, m);
  plan_.bound_[s] = std::move(t);
  plan_.originals_[s] = tensor;
  return Status::OK();
}

Status Plan::Builder::Buffers(const PlanSpec& spec) {
  for (const BufferSpec& b : spec.buffers) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(b.id));
    const std::string what = "buffer " + Id(b.id);
    if (is_buffer_[s] || state_[s] != kUndefined) return Invalid(what + " is defined twice");
    is_buffer_[s] = 1;
    if (!b.in_arena) continue;
    const ValueMeta& m = plan_.metas_[s];
    const auto element = static_cast<uint64_t>(c10::elementSize(m.dtype));
    const auto bytes = static_cast<uint64_t>(*CheckedStorageBytes(m));  // Values() checked it.
    const uint64_t end = b.arena_offset + bytes;
    if (b.arena_offset % 64 != 0) return Invalid(what + ": arena offset is not a multiple of 64");
    if (end > plan_.arena_bytes_ || end < b.arena_offset) {
      return Invalid(what + " ends at byte " + std::to_string(end) + " of an arena of " +
                     std::to_string(plan_.arena_bytes_));
    }
    plan_.buffers_[s].in_arena = true;
    plan_.buffers_[s].arena_element_offset =
        static_cast<int64_t>(b.arena_offset / element) + m.storage_offset;
  }
  for (uint32_t id : spec.outputs) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (plan_.buffers_[s].in_arena) return Invalid("output " + Id(id) + " is an arena buffer");
    plan_.output_slots_.push_back(s);
    is_output_[s] = 1;
  }
  return Status::OK();
}

Status Plan::Builder::Build(const PlanSpec& spec, const PlanBinding& binding) {
  if (spec.arena_bytes > static_cast<uint64_t>(INT64_MAX)) {
    return Invalid("an arena of " + std::to_string(spec.arena_bytes) + " bytes");
  }
  KILN_RETURN_IF_ERROR(Values(spec));
  // Kernels before constants: a plan whose kernels cannot load fails before it copies anything
  // to the device.
  KILN_RETURN_IF_ERROR(Kernels(spec, binding));
  for (const ConstantSpec& c : spec.constants) {
    KILN_ASSIGN_OR_RETURN(const at::Tensor tensor, ConstantTensor(c));
    KILN_RETURN_IF_ERROR(Bind(c.value.id, tensor, "constant"));
  }
  // Parameters take the plan's first inputs, bound once like constants (and, unlike them,
  // watched by the prologue: they may change between calls).
  const size_t num_params = binding.params.size();
  if (num_params > spec.inputs.size()) {
    return Invalid("binds " + std::to_string(num_params) + " parameters to a plan of " +
                   std::to_string(spec.inputs.size()) + " inputs");
  }
  for (size_t i = 0; i < num_params; ++i) {
    KILN_RETURN_IF_ERROR(Bind(spec.inputs[i], binding.params[i], "parameter"));
  }
  KILN_RETURN_IF_ERROR(Buffers(spec));

  // The prologue reads bound values only: the per-call inputs are defined after it.
  KILN_RETURN_IF_ERROR(Steps(spec.prologue, "prologue step", true, &plan_.prologue_));
  for (uint32_t id : spec.prologue_outputs) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    KILN_RETURN_IF_ERROR(Require(s, "prologue output"));
    if (is_output_[s]) return Invalid("prologue output " + Id(id) + " is a plan output");
    plan_.prologue_output_slots_.push_back(s);
  }
  plan_.watched_.assign(watched_.begin(), watched_.end());
  for (size_t i = num_params; i < spec.inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(spec.inputs[i]));
    KILN_RETURN_IF_ERROR(Define(s, "input"));
    plan_.input_slots_.push_back(s);
  }
  KILN_RETURN_IF_ERROR(Steps(spec.steps, "step", false, &plan_.steps_));
  for (int s : plan_.output_slots_) KILN_RETURN_IF_ERROR(Require(s, "output"));
  return InputUpdates(spec, num_params);
}

Status Plan::Builder::InputUpdates(const PlanSpec& spec, size_t num_params) {
  std::set<int> updated;
  for (size_t i = 0; i < spec.input_updates.size(); ++i) {
    const InputUpdateSpec& u = spec.input_updates[i];
    const std::string where = "input update " + std::to_string(i);
    auto input = std::find(spec.inputs.begin(), spec.inputs.end(), u.input);
    if (input == spec.inputs.end()) {
      return Invalid(where + ": " + Id(u.input) + " is not an input");
    }
    InputUpdate update;
    KILN_ASSIGN_OR_RETURN(update.input_slot, Slot(u.input));
    KILN_ASSIGN_OR_RETURN(update.value_slot, Slot(u.value));
    if (!updated.insert(update.input_slot).second) {
      return Invalid(where + ": " + Id(u.input) + " is updated twice");
    }
    KILN_RETURN_IF_ERROR(Require(update.value_slot, where));
    const size_t position = static_cast<size_t>(input - spec.inputs.begin());
    if (position < num_params) {
      // The update writes the caller's parameter, which the steps must be reading themselves.
      const at::Tensor& bound = plan_.bound_[update.input_slot];
      if (!bound.is_same(plan_.originals_[update.input_slot])) {
        return Invalid(where + ": parameter " + Id(u.input) +
                       " is read through a copy (another device or layout)");
      }
    } else {
      update.call_index = static_cast<int>(position - num_params);
    }
    const ValueMeta& in = plan_.metas_[update.input_slot];
    ValueMeta after = in;
    if (u.has_new_meta) {
      const auto dtype = ScalarTypeOf(u.new_meta.dtype);
      if (!dtype || *dtype != in.dtype) return Invalid(where + ": new metadata changes the dtype");
      after = ValueMeta{*dtype, u.new_meta.sizes, u.new_meta.strides, u.new_meta.storage_offset};
      if (after.sizes.size() != after.strides.size() || after.storage_offset < 0 ||
          std::any_of(after.sizes.begin(), after.sizes.end(), [](int64_t x) { return x < 0; }) ||
          std::any_of(after.strides.begin(), after.strides.end(),
                      [](int64_t x) { return x < 0; }) ||
          !CheckedStorageBytes(after)) {
        return Invalid(where + ": malformed new metadata");
      }
      update.restride = true;
      update.new_meta = after;
    }
    const ValueMeta& value = plan_.metas_[update.value_slot];
    if (value.dtype != after.dtype || value.sizes != after.sizes) {
      return Invalid(where + ": " + Id(u.value) + " is " +
                     Describe(value.dtype, value.sizes, value.strides) + ", its input " +
                     Describe(after.dtype, after.sizes, after.strides));
    }
    plan_.input_updates_.push_back(std::move(update));
  }
  return Status::OK();
}

Status Plan::Builder::Kernels(const PlanSpec& spec, const PlanBinding& binding) {
  auto is_kernel = [](const StepSpec& s) { return std::holds_alternative<KernelStepSpec>(s); };
  const bool has_kernels = std::any_of(spec.steps.begin(), spec.steps.end(), is_kernel) ||
                           std::any_of(spec.prologue.begin(), spec.prologue.end(), is_kernel);
  if (!has_kernels) return Status::OK();
  const c10::Device& device = plan_.device_;
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    if (!device.has_index()) return Invalid("a CUDA plan names its device's index, not 'cuda'");
    StatusOr<const CudaDriver*> driver = CudaDriver::Process();
    if (!driver.ok()) return Invalid(driver.status().message());
    StatusOr<std::unique_ptr<CudaModule>> module =
        CudaModule::Load(**driver, device.index(), binding.kernel_binary, binding.kernel_ptx);
    if (!module.ok()) return Invalid(module.status().message());
    plan_.cuda_module_ = std::move(*module);
    return Status::OK();
#else
    return Invalid("kernel steps on " + device.str() + " need a kiln._C built with CUDA");
#endif
  }
  if (!device.is_cpu()) return Invalid("kernel steps cannot run on " + device.str());
  if (binding.kernel_binary.empty()) return Invalid("the plan launches kernels but has no binary");
  StatusOr<std::unique_ptr<KernelLibrary>> library = KernelLibrary::Load(binding.kernel_binary);
  if (!library.ok()) return Invalid(library.status().message());
  plan_.library_ = std::move(*library);
  return Status::OK();
}

Status Plan::Builder::Steps(const std::vector<StepSpec>& specs, const char* list, bool prologue,
                            std::vector<Step>* into) {
  for (size_t i = 0; i < specs.size(); ++i) {
    Step step;
    if (const auto* k = std::get_if<KernelStepSpec>(&specs[i])) {
      step.label = std::string(list) + " " + std::to_string(i) + " (kernel " + k->symbol + ")";
      KILN_RETURN_IF_ERROR(KernelStepOf(*k, prologue, &step));
      KILN_RETURN_IF_ERROR(Release(k->release, &step));
      ++plan_.num_kernels_;
    } else {
      const auto& l = std::get<LibraryStepSpec>(specs[i]);
      step.label = std::string(list) + " " + std::to_string(i) + " (" + l.op + ")";
      KILN_RETURN_IF_ERROR(LibraryStepOf(l, prologue, &step));
      KILN_RETURN_IF_ERROR(Release(l.release, &step));
      ++plan_.num_library_calls_;
      if (plan_.first_random_step_.empty() &&
          DrawsRandomNumbers(std::get<LibraryStep>(step.body).op,
                             std::get<LibraryStep>(step.body).stack)) {
        plan_.first_random_step_ = step.label;
      }
    }
    into->push_back(std::move(step));
  }
  return Status::OK();
}

Status Plan::Builder::KernelStepOf(const KernelStepSpec& k, bool prologue, Step* step) {
  const std::string& where = step->label;
  KernelStep ks{};
  ks.symbol = k.symbol;
  if (plan_.cuda_module_) {
    ks.fn = nullptr;
    KILN_RETURN_IF_ERROR(CudaLaunchOf(k, where, &ks.cuda));
  } else {
    StatusOr<kiln_kernel_fn> fn = plan_.library_->Resolve(k.symbol);
    if (!fn.ok()) return Invalid(where + ": " + fn.status().message());
    ks.fn = *fn;
  }
  const std::unordered_set<uint32_t> writes(k.writes.begin(), k.writes.end());
  for (uint32_t id : k.writes) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (!is_buffer_[s]) return Invalid(where + " writes " + Id(id) + ", not a buffer");
    if (std::find(k.args.begin(), k.args.end(), id) == k.args.end()) {
      return Invalid(where + " writes " + Id(id) + ", which is not one of its arguments");
    }
  }
  for (uint32_t id : k.args) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (is_buffer_[s] && state_[s] == kUndefined) {
      if (prologue && plan_.buffers_[s].in_arena) {
        return Invalid(where + ": prologue buffer " + Id(id) + " is in the per-call arena");
      }
      state_[s] = kDefined;
      step->allocate.push_back(s);
    }
    if (!writes.count(id)) KILN_RETURN_IF_ERROR(Require(s, where));
    if (prologue && plan_.originals_[s].defined()) watched_.insert(s);
    if (state_[s] == kReleased) KILN_RETURN_IF_ERROR(Require(s, where));
    ks.slots.push_back(s);
    // Constants are checked too: a parameter bound as one can be resized in place later.
    ks.checked.push_back(!is_buffer_[s]);
  }
  for (uint32_t id : k.writes) written_[*Slot(id)] = 1;
  step->body = std::move(ks);
  return Status::OK();
}

Status Plan::Builder::CudaLaunchOf(const KernelStepSpec& k, const std::string& where,
                                   CudaKernel* out) const {
  auto dims = [&](const std::vector<uint32_t>& given, const char* what,
                  std::array<uint32_t, 3>* into) -> Status {
    if (given.empty() || given.size() > 3) {
      return Invalid(where + ": a CUDA launch's " + what + " has " + std::to_string(given.size()) +
                     " dimensions, not 1 to 3");
    }
    for (size_t d = 0; d < given.size(); ++d) {
      if (given[d] == 0) return Invalid(where + ": a CUDA launch's " + what + " has a 0 extent");
      (*into)[d] = given[d];
    }
    return Status::OK();
  };
  KILN_RETURN_IF_ERROR(dims(k.grid, "grid", &out->grid));
  KILN_RETURN_IF_ERROR(dims(k.block, "block", &out->block));
  const uint64_t threads = uint64_t{out->block[0]} * out->block[1] * out->block[2];
  if (threads > 1024) {
    return Invalid(where + ": a block of " + std::to_string(threads) + " threads (at most 1024)");
  }
  out->shared_memory_bytes = k.shared_memory_bytes;
  StatusOr<CUfunc_st*> fn = plan_.cuda_module_->Resolve(k.symbol, k.shared_memory_bytes);
  if (!fn.ok()) return Invalid(where + ": " + fn.status().message());
  out->function = *fn;
  return Status::OK();
}

Status Plan::Builder::LibraryStepOf(const LibraryStepSpec& l, bool prologue, Step* step) {
  const std::string& where = step->label;
  KILN_ASSIGN_OR_RETURN(LibraryStep ls, BindLibrary(l, where));
  const auto& formals = ls.op.schema().arguments();
  auto check_read = [&](int s, size_t position) -> Status {
    KILN_RETURN_IF_ERROR(Require(s, where));
    if (prologue && plan_.originals_[s].defined()) watched_.insert(s);
    if (plan_.buffers_[s].in_arena && MayAlias(formals[position])) {
      return Invalid(where + ": its result may be a view of arena buffer " + Id(plan_.ids_[s]));
    }
    return Status::OK();
  };
  for (const auto& [position, s] : ls.tensor_args) KILN_RETURN_IF_ERROR(check_read(s, position));
  for (const auto& list : ls.list_args) {
    for (int s : list.slots) KILN_RETURN_IF_ERROR(check_read(s, list.position));
  }
  for (int s : ls.outputs) {
    if (is_buffer_[s]) return Invalid(where + " defines buffer " + Id(plan_.ids_[s]));
    KILN_RETURN_IF_ERROR(Define(s, where));
  }
  step->body = std::move(ls);
  return Status::OK();
}

Status Plan::Builder::Release(const std::vector<uint32_t>& ids, Step* step) {
  for (uint32_t id : ids) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (is_output_[s]) return Invalid(step->label + " releases plan output " + Id(id));
    if (plan_.buffers_[s].in_arena) {
      return Invalid(step->label + " releases arena buffer " + Id(id));
    }
    if (state_[s] != kDefined) {
      return Invalid(step->label + " releases " + Id(id) + ", which is not live there");
    }
    state_[s] = kReleased;
    step->release.push_back(s);
  }
  return Status::OK();
}

StatusOr<Plan::LibraryStep> Plan::Builder::BindLibrary(const LibraryStepSpec& spec,
                                                       const std::string& where) const {
  auto [name, overload] = SplitOpName(spec.op);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) return Invalid(where + ": no such operator in the dispatcher");
  const c10::FunctionSchema& schema = handle->schema();
  if (!spec.schema.empty()) {
    // The daemon admitted the op for the schema the graph declared: another torch's op of the
    // same name may do something else. Compared as parsed schemas (torch's text of a schema
    // parses back to it), not as text: formatting a schema through an ostream crossed into
    // torch crashed on the CPython 3.12 + torch 2.11 host, as c10::str did.
    std::optional<c10::FunctionSchema> declared;
    try {
      declared = torch::jit::parseSchema(spec.schema);
    } catch (const c10::Error&) {
    }
    if (!declared || !(*declared == schema)) {
      return Invalid(where + ": the dispatcher's schema is not the one the plan was made for, " +
                     spec.schema);
    }
  }
  const auto& formals = schema.arguments();
  LibraryStep step{*handle, std::vector<c10::IValue>(formals.size()), {}, {}, {}};

  std::vector<char> bound(formals.size(), 0);
  size_t next_positional = 0;
  bool seen_named = false;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const CallArg& a = spec.args[i];
    if (a.kind == CallArg::Kind::kUnset) {
      return Invalid(where + ": argument " + std::to_string(i) + " has no value");
    }
    size_t position;
    if (a.name.empty()) {
      if (seen_named) return Invalid(where + ": a positional argument follows a named one");
      position = next_positional++;
      if (position >= formals.size()) {
        return Invalid(where + ": more than " + std::to_string(formals.size()) +
                       " positional arguments");
      }
    } else {
      seen_named = true;
      auto it = std::find_if(formals.begin(), formals.end(),
                             [&](const c10::Argument& f) { return f.name() == a.name; });
      if (it == formals.end()) {
        return Invalid(where + ": the schema has no argument '" + a.name + "'");
      }
      position = static_cast<size_t>(it - formals.begin());
    }
    const c10::Argument& formal = formals[position];
    const std::string arg_where = where + ", argument '" + formal.name() + "'";
    if (bound[position]) return Invalid(arg_where + " is given twice");
    bound[position] = 1;
    const FormalType f = Unwrap(formal);
    if (a.kind == CallArg::Kind::kValue) {
      if (!IsTensor(f.type)) {
        return Invalid(arg_where + ": a tensor cannot bind to " + f.type->str());
      }
      KILN_ASSIGN_OR_RETURN(const int s, Slot(static_cast<uint32_t>(a.i)));
      step.tensor_args.emplace_back(position, s);
    } else if (a.kind == CallArg::Kind::kValues) {
      const c10::TypePtr element = ListElement(f.type);
      bool optional_elements = false;
      if (element != nullptr && !IsTensor(element)) {
        auto opt = element->cast<c10::OptionalType>();
        optional_elements = opt != nullptr && IsTensor(opt->getElementType());
      }
      if (element == nullptr || (!IsTensor(element) && !optional_elements)) {
        return Invalid(arg_where + ": a tensor list cannot bind to " + f.type->str());
      }
      std::vector<int> slots;
      for (int64_t id : a.list) {
        KILN_ASSIGN_OR_RETURN(const int s, Slot(static_cast<uint32_t>(id)));
        slots.push_back(s);
      }
      step.list_args.push_back({position, std::move(slots), optional_elements});
    } else {
      KILN_ASSIGN_OR_RETURN(step.stack[position], ConvertConstant(a, formal, arg_where));
    }
  }
  for (size_t position = 0; position < formals.size(); ++position) {
    if (bound[position]) continue;
    if (!formals[position].default_value()) {
      return Invalid(where + ": required argument '" + formals[position].name() + "' is missing");
    }
    step.stack[position] = *formals[position].default_value();
  }

  size_t fixed_returns = 0;
  bool list_return = false;
  for (const c10::Argument& r : schema.returns()) {
    const FormalType f = Unwrap(r);
    const c10::TypePtr element = ListElement(f.type);
    if (IsTensor(f.type)) {
      ++fixed_returns;
    } else if (element != nullptr && IsTensor(element) && !f.optional) {
      list_return = true;
    } else if (!f.optional && (IsIntLike(f.type) || IsFloatLike(f.type) ||
                               f.type->kind() == c10::TypeKind::BoolType ||
                               f.type->kind() == c10::TypeKind::SymBoolType)) {
      step.skips_numbers = true;  // CUDA attention's sizes beside its tensors: bound to nothing
    } else {
      return Invalid(where + ": returns " + r.real_type()->str() + ", not tensors");
    }
  }
  if (!list_return && fixed_returns != spec.outputs.size()) {
    return Invalid(where + ": returns " + std::to_string(fixed_returns) +
                   " tensors, the plan names " + std::to_string(spec.outputs.size()));
  }
  for (uint32_t id : spec.outputs) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    step.outputs.push_back(s);
  }
  step.fresh_results =
      !list_return && std::none_of(schema.returns().begin(), schema.returns().end(),
                                   [](const c10::Argument& r) { return r.alias_info() != nullptr; });
  step.relayout = plan_.device_.is_cuda() && step.fresh_results;
  return step;
}

at::Tensor Plan::AllocateBuffer(int slot, const at::Tensor& arena) const {
  const ValueMeta& m = metas_[slot];
  if (!buffers_[slot].in_arena) {
    // On the CPU straight from the allocator: what at::empty_strided ends in, without its trip
    // through the dispatcher (a plan allocates every intermediate of every call).
    if (device_.is_cpu() && m.storage_offset == 0) {
      return at::Tensor(at::detail::empty_strided_cpu(m.sizes, m.strides, m.dtype));
    }
    return EmptyWithLayout(m, at::TensorOptions().dtype(m.dtype).device(device_));
  }
  // A typed view of the arena's bytes (construction checked that it fits), made as
  // at::empty({0}).set_(...) would make it, without the two dispatched calls. The new tensor's
  // keys are the arena's: same device, and the TensorImpl applies the inference mode in force.
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(arena.storage()), arena.key_set(),
                                                   c10::scalarTypeToTypeMeta(m.dtype));
  impl->set_sizes_and_strides(m.sizes, m.strides, buffers_[slot].arena_element_offset);
  return at::Tensor(std::move(impl));
}

namespace {

// The parallel_for of the kernel ABI: torch's intra-op thread pool (at::parallel_for), so
// kernels share torch's threads and its set_num_threads.
void ParallelFor(int64_t begin, int64_t end, int64_t grain, kiln_range_fn fn, void* const* args) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(b, e, args); });
}

}  // namespace

Status Plan::RunKernel(const KernelStep& k, std::vector<at::Tensor>& vals) const {
  constexpr size_t kInline = 16;
  std::array<void*, kInline> inline_pointers;
  std::vector<void*> heap_pointers;
  void** pointers = inline_pointers.data();
  if (k.slots.size() > kInline) {
    heap_pointers.resize(k.slots.size());
    pointers = heap_pointers.data();
  }
  // Copies made for this launch only: the value table keeps the caller's tensor, so an output
  // that names an input is still that input. (Their data pointers are taken before the next
  // push_back; moving a Tensor does not move its data.)
  std::vector<at::Tensor> relaid;
  for (size_t i = 0; i < k.slots.size(); ++i) {
    const int s = k.slots[i];
    const at::Tensor* t = &vals[s];
    if (!t->defined()) {
      return Status::RuntimeError("argument " + std::to_string(i) + " (" + Id(ids_[s]) +
                                  ") is undefined");
    }
    if (k.checked[i]) {
      const ValueMeta& m = metas_[s];
      if (t->device().type() != device_.type() || t->scalar_type() != m.dtype ||
          t->sizes() != c10::IntArrayRef(m.sizes) ||
          (cuda_module_ && t->device().index() != device_.index())) {
        return Status::RuntimeError(Id(ids_[s]) + " is " +
                                    Describe(t->scalar_type(), t->sizes(), t->strides()) + " on " +
                                    t->device().str() + ", the kernel was built for " +
                                    Describe(m.dtype, m.sizes, m.strides) + " on " + device_.str());
      }
      if (!HasLayout(*t, m)) {
        // The kernel's index arithmetic has the metadata's strides built in.
        relaid.push_back(CopyWithLayout(*t, m));
        t = &relaid.back();
      }
    }
    pointers[i] = t->data_ptr();
  }
  // Visible to torch.profiler beside the library ops; costs a flag test when nothing records.
  RECORD_FUNCTION(k.symbol, c10::ArrayRef<const c10::IValue>{});
  if (cuda_module_) return LaunchCuda(k, pointers);
  k.fn(pointers, &ParallelFor);
  return Status::OK();
}

Status Plan::LaunchCuda(const KernelStep& k, void* const* pointers) const {
#ifdef KILN_WITH_CUDA
  // Run's device guard made the plan's device current: this is the caller's stream on it.
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  return cuda_module_->Launch(k.cuda, pointers, k.slots.size(), stream);
#else
  (void)k, (void)pointers;  // Create refuses CUDA kernels without CUDA.
  return Status::RuntimeError("kiln._C was built without CUDA");
#endif
}

Status Plan::RunLibrary(const LibraryStep& l, std::vector<at::Tensor>& vals) const {
  std::vector<c10::IValue> stack = l.stack;
  for (const auto& [position, s] : l.tensor_args) {
    // An undefined value (a Tensor? result that was None) goes on as None.
    if (vals[s].defined()) stack[position] = vals[s];
  }
  for (const auto& list : l.list_args) {
    if (list.optional_elements) {
      c10::List<std::optional<at::Tensor>> tensors;
      tensors.reserve(list.slots.size());
      for (int s : list.slots) {
        tensors.push_back(vals[s].defined() ? std::optional<at::Tensor>(vals[s]) : std::nullopt);
      }
      stack[list.position] = std::move(tensors);
    } else {
      c10::List<at::Tensor> tensors;
      tensors.reserve(list.slots.size());
      for (int s : list.slots) tensors.push_back(vals[s]);
      stack[list.position] = std::move(tensors);
    }
  }
  l.op.callBoxed(&stack);
  size_t next = 0;
  auto take = [&](const c10::IValue& v) {
    if (l.skips_numbers && (v.isInt() || v.isDouble() || v.isBool() || v.isSymInt() ||
                            v.isSymFloat() || v.isSymBool())) {
      return Status::OK();
    }
    if (!v.isTensor() && !v.isNone()) return Status::RuntimeError("returned a non-tensor");
    if (next >= l.outputs.size()) {
      return Status::RuntimeError("returned more tensors than expected");
    }
    const int s = l.outputs[next++];
    vals[s] = v.isTensor() ? v.toTensor() : at::Tensor();
    if (l.fresh_results && vals[s].defined() && vals[s].scalar_type() != metas_[s].dtype &&
        vals[s].layout() == at::kStrided) {
      // A result whose real kernel and fake disagree on its dtype (CUDA's batch norm in training
      // form returns the new running statistics in their own dtype, its fake in float32): the
      // steps after it were traced, and planned, for the fake's, and read it cast so.
      vals[s] = CopyWithLayout(vals[s], metas_[s], metas_[s].dtype);
    } else if (l.relayout && vals[s].defined() && !HasLayout(vals[s], metas_[s])) {
      // A kernel whose layout the trace could not know (the attention op picks its kernel for
      // the real inputs, and its kernels lay results out differently): every reader, views and
      // plan outputs included, sees the metadata's layout.
      vals[s] = CopyWithLayout(vals[s], metas_[s]);
    }
    return Status::OK();
  };
  for (const c10::IValue& v : stack) {
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) KILN_RETURN_IF_ERROR(take(t));
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) KILN_RETURN_IF_ERROR(take(e));
    } else {
      KILN_RETURN_IF_ERROR(take(v));
    }
  }
  if (next != l.outputs.size()) {
    return Status::RuntimeError("returned " + std::to_string(next) + " tensors, the plan names " +
                                std::to_string(l.outputs.size()));
  }
  return Status::OK();
}

// A CUDA plan's prologue step whose tensor arguments all have at most this many elements runs
// on the host: a folded batch norm's per-channel statistics, the scale and shift made of them.
constexpr int64_t kHostPrologueElements = 1 << 14;

bool Plan::SmallEnoughForHost(const LibraryStep& l, const std::vector<at::Tensor>& vals) const {
  // A view stays a view of the device's tensor (it runs no kernel; a broadcast one, copied to
  // the device, would lose the layout its readers were planned for).
  for (const c10::Argument& r : l.op.schema().returns()) {
    if (r.alias_info() != nullptr) return false;
  }
  bool any = false;
  auto small = [&](int s) {
    const at::Tensor& t = vals[s];
    if (!t.defined()) return true;
    any = true;
    return t.layout() == at::kStrided && t.numel() <= kHostPrologueElements;
  };
  for (const auto& [position, s] : l.tensor_args) {
    if (!small(s)) return false;
  }
  for (const auto& list : l.list_args) {
    for (int s : list.slots) {
      if (!small(s)) return false;
    }
  }
  return any;
}

// The prologue runs once per parameter version, but the first time a process calls one of
// ATen's CUDA kernels CUDA loads its module: 10-25 ms each for rsqrt, neg, mul (an H200, torch
// 2.11), which eager's model never called, on a warm process's first call. Their CPU kernels
// cost microseconds; the copies there and back, a few per batch norm, little more. Where the
// host cannot run the op (a dtype without a CPU kernel), the device does, as without this.
Status Plan::RunLibraryOnHost(const LibraryStep& l, std::vector<at::Tensor>& vals,
                              std::vector<at::Tensor>& host) const {
  auto fetch = [&](int s) {
    if (vals[s].defined() && !host[s].defined()) host[s] = vals[s].to(at::kCPU);
  };
  for (const auto& [position, s] : l.tensor_args) fetch(s);
  for (const auto& list : l.list_args) {
    for (int s : list.slots) fetch(s);
  }
  bool ran = false;
  try {
    ran = RunLibrary(l, host).ok();
  } catch (const c10::Error&) {
  }
  if (!ran) {
    for (int s : l.outputs) host[s].reset();
    return RunLibrary(l, vals);
  }
  ++host_prologue_steps_;  // PrologueValues, the one caller, holds prologue_mutex_
  for (int s : l.outputs) {
    if (!host[s].defined()) {
      vals[s].reset();
    } else if (host[s].is_cpu()) {
      vals[s] = host[s].to(device_);
    } else {  // made on the device (an explicit device argument): fetched again if read here
      vals[s] = host[s];
      host[s].reset();
    }
  }
  return Status::OK();
}

Status Plan::RunSteps(const std::vector<Step>& steps, std::vector<at::Tensor>& vals,
                      const at::Tensor& arena, std::vector<at::Tensor>* host) const {
  // The graph was traced with autocast applied: its casts are steps of the plan. Autocast left on
  // would cast the library calls' arguments again (a float32 step given bfloat16 results).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const Step* step = nullptr;
  Status status;
  // ATen reports failures by throwing c10::Error: caught here, once per run, not per step.
  try {
    for (const Step& s : steps) {
      step = &s;
      for (int b : s.allocate) vals[b] = AllocateBuffer(b, arena);
      if (const auto* k = std::get_if<KernelStep>(&s.body)) {
        status = RunKernel(*k, vals);
      } else if (const auto& l = std::get<LibraryStep>(s.body);
                 host != nullptr && SmallEnoughForHost(l, vals)) {
        status = RunLibraryOnHost(l, vals, *host);
      } else {
        status = RunLibrary(l, vals);
      }
      if (!status.ok()) break;
      for (int r : s.release) vals[r].reset();
    }
  } catch (const c10::Error& e) {
    status = Status::RuntimeError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    status = Status::RuntimeError(e.what());
  }
  if (status.ok()) return status;
  return status.Prefixed("kiln plan: " + step->label + ": ");
}

Plan::Stamps Plan::StampWatched() const {
  Stamps stamps;
  stamps.reserve(watched_.size());
  for (int s : watched_) {
    const at::Tensor& t = originals_[s];
    stamps.emplace_back(t._version(), t.data_ptr());
  }
  return stamps;
}

StatusOr<std::shared_ptr<const std::vector<at::Tensor>>> Plan::PrologueValues() const {
  std::lock_guard<std::mutex> lock(prologue_mutex_);
  if (prologue_values_) {
    // The per-call check: a version counter and a data pointer per watched constant.
    bool current = true;
    for (size_t i = 0; i < watched_.size() && current; ++i) {
      const at::Tensor& t = originals_[watched_[i]];
      current =
          prologue_stamps_[i].first == t._version() && prologue_stamps_[i].second == t.data_ptr();
    }
    if (current) return prologue_values_;
  }
  // Stamped before the run: a tensor modified while the prologue runs is seen next call.
  Stamps now = StampWatched();
  std::vector<at::Tensor> vals = bound_;
  std::vector<at::Tensor> host(device_.is_cuda() ? vals.size() : 0);
  KILN_RETURN_IF_ERROR(
      RunSteps(prologue_, vals, at::Tensor(), device_.is_cuda() ? &host : nullptr));
  auto kept = std::make_shared<std::vector<at::Tensor>>();
  kept->reserve(prologue_output_slots_.size());
  for (int s : prologue_output_slots_) {
    // The prologue is ATen's work, which lays its results out as it does and promotes types
    // as it does (a bfloat16 weight times a float32 scale is float32); the steps that read them
    // (kernels among them) were planned for the metadata's layout and dtype. Once per parameter
    // version, so a copy where they differ costs nothing that matters. (Opaque tensors, oneDNN's
    // prepacked weights, have no strides: only the library call they were made for reads them.)
    const at::Tensor& t = vals[s];
    const ValueMeta& m = metas_[s];
    const bool conform = t.defined() && t.layout() == at::kStrided &&
                         (t.scalar_type() != m.dtype || !HasLayout(t, m));
    kept->push_back(conform ? CopyWithLayout(t, m, m.dtype) : t);
  }
  prologue_values_ = std::move(kept);
  prologue_stamps_ = std::move(now);
  ++prologue_runs_;
  return prologue_values_;
}

int Plan::host_prologue_steps() const {
  std::lock_guard<std::mutex> lock(prologue_mutex_);
  return host_prologue_steps_;
}

int Plan::prologue_runs() const {
  std::lock_guard<std::mutex> lock(prologue_mutex_);
  return prologue_runs_;
}

Status Plan::Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs) const {
  return RunMain(nullptr, inputs, outputs);
}

Status Plan::RunWithPrologue(const std::vector<at::Tensor>& prologue_values,
                             const std::vector<at::Tensor>& inputs,
                             std::vector<at::Tensor>* outputs) const {
  if (prologue_values.size() != prologue_output_slots_.size()) {
    return Status::RuntimeError("kiln plan: its prologue has " +
                                std::to_string(prologue_output_slots_.size()) + " outputs, " +
                                std::to_string(prologue_values.size()) + " were given");
  }
  return RunMain(&prologue_values, inputs, outputs);
}

Status Plan::RunMain(const std::vector<at::Tensor>* prologue_values,
                     const std::vector<at::Tensor>& inputs,
                     std::vector<at::Tensor>* outputs) const {
  if (inputs.size() != input_slots_.size()) {
    return Status::RuntimeError("kiln plan: takes " + std::to_string(input_slots_.size()) +
                                " inputs, got " + std::to_string(inputs.size()));
  }
  // RunSteps names the step that failed; this catches what fails between steps (reading a
  // parameter's version, allocating the arena).
  try {
    // A CUDA plan's device is current while it runs (kernels launch on its current stream);
    // a CPU plan's guard holds nothing.
    c10::OptionalDeviceGuard device_guard;
    if (!device_.is_cpu()) device_guard.reset_device(device_);
    std::vector<at::Tensor> vals = bound_;
    if (!prologue_.empty()) {
      std::shared_ptr<const std::vector<at::Tensor>> kept;
      if (prologue_values == nullptr) {
        KILN_ASSIGN_OR_RETURN(kept, PrologueValues());
        prologue_values = kept.get();
      }
      for (size_t i = 0; i < prologue_output_slots_.size(); ++i) {
        vals[prologue_output_slots_[i]] = (*prologue_values)[i];
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i) vals[input_slots_[i]] = inputs[i];
    at::Tensor arena;
    if (arena_bytes_ > 0) {
      const auto bytes = static_cast<int64_t>(arena_bytes_);
      arena = device_.is_cpu()
                  ? at::Tensor(at::detail::empty_cpu({bytes}, at::kByte))
                  : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    }
    KILN_RETURN_IF_ERROR(RunSteps(steps_, vals, arena));
    if (!input_updates_.empty()) KILN_RETURN_IF_ERROR(ApplyInputUpdates(vals, inputs));
    outputs->clear();
    outputs->reserve(output_slots_.size());
    for (int s : output_slots_) outputs->push_back(vals[s]);
    return Status::OK();
  } catch (const c10::Error& e) {
    return Status::RuntimeError(std::string("kiln plan: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::RuntimeError(std::string("kiln plan: ") + e.what());
  }
}

Status Plan::ApplyInputUpdates(const std::vector<at::Tensor>& vals,
                               const std::vector<at::Tensor>& inputs) const {
  // Every check before the first write: a plan that fails here leaves the inputs as they were,
  // so that the eager fallback runs the graph on what the caller passed.
  std::vector<at::Tensor> targets, sources;
  for (const InputUpdate& u : input_updates_) {
    // Built only for a failure's message: this runs on every call.
    const auto where = [&] {
      return "kiln plan: input update of " + Id(ids_[u.input_slot]) + ": ";
    };
    const at::Tensor& target =
        u.call_index >= 0 ? inputs[static_cast<size_t>(u.call_index)] : originals_[u.input_slot];
    const at::Tensor& value = vals[u.value_slot];
    const ValueMeta& in = metas_[u.input_slot];
    if (!target.defined() || !value.defined()) {
      return Status::RuntimeError(where() + "an undefined tensor");
    }
    if (target.scalar_type() != in.dtype || target.sizes() != c10::IntArrayRef(in.sizes) ||
        value.scalar_type() != in.dtype) {
      return Status::RuntimeError(where() + "the input is " +
                                  Describe(target.scalar_type(), target.sizes(), target.strides()) +
                                  ", the plan's " + Describe(in.dtype, in.sizes, in.strides));
    }
    if (u.restride) {
      const int64_t bytes = *CheckedStorageBytes(u.new_meta);  // Create checked it fits.
      if (!target.has_storage() || static_cast<int64_t>(target.storage().nbytes()) < bytes) {
        return Status::RuntimeError(where() + "its storage is smaller than its new layout spans");
      }
    }
    targets.push_back(target);
    sources.push_back(value);
  }
  for (size_t i = 0; i < input_updates_.size(); ++i) {
    // A value read through a view of an input written before it (or of its own input, in
    // another layout) is copied first: every value is what the graph computed from the inputs
    // as they were passed.
    const InputUpdate& u = input_updates_[i];
    for (size_t j = 0; j < targets.size(); ++j) {
      if (!sources[i].is_alias_of(targets[j])) continue;
      const ValueMeta& own = u.restride ? u.new_meta : metas_[u.input_slot];
      if (j == i && (u.restride || HasLayout(targets[j], own)) && HasLayout(sources[i], own)) {
        continue;  // the input's own elements, in its final layout: copy_ leaves them
      }
      sources[i] = sources[i].clone();
      break;
    }
  }
  for (size_t i = 0; i < input_updates_.size(); ++i) {
    const InputUpdate& u = input_updates_[i];
    at::Tensor target = targets[i];
    if (u.restride)
      target.as_strided_(u.new_meta.sizes, u.new_meta.strides, u.new_meta.storage_offset);
    target.copy_(sources[i]);
  }
  return Status::OK();
}

std::vector<Plan::OutputSource> Plan::OutputSources() const {
  std::vector<OutputSource> sources;
  for (int s : output_slots_) {
    auto input = std::find(input_slots_.begin(), input_slots_.end(), s);
    if (input != input_slots_.end()) {
      sources.push_back({OutputSource::kInput, static_cast<size_t>(input - input_slots_.begin())});
    } else if (bound_[s].defined()) {
      sources.push_back({OutputSource::kBound, 0});
    } else {
      sources.push_back({OutputSource::kComputed, 0});
    }
  }
  return sources;
}

std::vector<at::Tensor> Plan::ExampleInputs() const {
  std::vector<at::Tensor> inputs;
  inputs.reserve(input_slots_.size());
  for (int s : input_slots_) {
    const ValueMeta& m = metas_[s];
    inputs.push_back(EmptyWithLayout(m, at::TensorOptions().dtype(m.dtype).device(device_)));
    inputs.back().zero_();
  }
  return inputs;
}

std::vector<at::Tensor> Plan::BoundTensors() const {
  std::vector<at::Tensor> bound;
  for (const at::Tensor& t : bound_) {
    if (t.defined()) bound.push_back(t);
  }
  return bound;
}

std::string Plan::FirstCallOf(const std::vector<std::string>& ops) const {
  for (const Step& step : steps_) {
    const auto* library = std::get_if<LibraryStep>(&step.body);
    if (library == nullptr) continue;
    const std::string& name = library->op.schema().name();
    for (const std::string& op : ops) {
      if (name == op) return step.label;
    }
  }
  return "";
}

}  // namespace kiln::runtime
