// Building a Plan: slots, the checks of the whole plan, kernel symbols, library calls bound to
// their schemas, constants and parameters bound once.
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
#include <unordered_map>
#include <unordered_set>

#include "runtime/value_layout.h"
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
    case K::kSymInt:
    case K::kSymInts:
      break;
  }
  return Invalid(where + ": internal: a tensor or SymInt argument bound as a constant");
}

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

// Whether an argument may be aliased by the op's result (a view: "Tensor(a) self").
bool MayAlias(const c10::Argument& formal) {
  return formal.alias_info() != nullptr && !formal.alias_info()->isWrite();
}

// Ops whose one result is a view of their first argument, its sizes, strides and storage offset
// determined by the argument's and the op's other arguments alone: the trace's metadata of the
// result is what the op makes of an input laid out as the input's metadata says.
bool IsPlainView(const std::string& op) {
  static const auto* ops = new std::unordered_set<std::string>{
      "aten::view",         "aten::_unsafe_view", "aten::transpose.int", "aten::t",
      "aten::permute",      "aten::unsqueeze",    "aten::squeeze",       "aten::squeeze.dim",
      "aten::squeeze.dims", "aten::expand",       "aten::slice.Tensor",  "aten::select.int",
      "aten::alias"};
  return ops->count(op) != 0;
}

// The tensor a kiln.v1.Constant holds: its elements are contiguous, little-endian, exactly
// numel * element size bytes.
StatusOr<at::Tensor> ConstantTensor(const ConstantSpec& c) {
  const std::string what = "constant " + ValueName(c.value.id);
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
  void KeepViewChains(std::vector<Step>& steps);
  Status LibraryStepOf(const LibraryStepSpec& l, bool prologue, Step* step);
  StatusOr<LibraryStep> BindLibrary(const LibraryStepSpec& spec, const std::string& where) const;
  Status Release(const std::vector<uint32_t>& ids, Step* step);
  Status InputUpdates(const PlanSpec& spec, size_t num_params);

  Plan& plan_;
  // Value id -> its size expressions, for the values whose sizes depend on the symbols.
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
    return Invalid("the plan uses " + ValueName(id) + " without metadata");
  }
  return static_cast<int>(it - plan_.ids_.begin());
}

Status Plan::Builder::Define(int s, const std::string& where) {
  if (state_[s] != kUndefined) {
    return Invalid(where + ": " + ValueName(plan_.ids_[s]) + " is defined twice");
  }
  state_[s] = kDefined;
  return Status::OK();
}

Status Plan::Builder::Require(int s, const std::string& where) const {
  if (state_[s] == kReleased) {
    return Invalid(where + ": " + ValueName(plan_.ids_[s]) + " is used after its release");
  }
  if (state_[s] != kDefined || (is_buffer_[s] && !written_[s])) {
    return Invalid(where + ": " + ValueName(plan_.ids_[s]) + " is used before it is computed");
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
    const std::string what = ValueName(v->id);
    if (!plan_.ids_.empty() && plan_.ids_.back() == v->id) {
      return Invalid(what + " has metadata twice");
    }
    const auto dtype = ScalarTypeOf(v->meta.dtype);
    if (!dtype) return Invalid(what + " has no valid dtype");
    ValueMeta meta{*dtype, v->meta.sizes, v->meta.strides, v->meta.storage_offset};
    if (meta.sizes.size() != meta.strides.size()) {
      return Invalid(what + ": sizes and strides differ in rank");
    }
    const bool symbolic = !v->meta.size_exprs.empty() || !v->meta.stride_exprs.empty() ||
                          !v->meta.storage_offset_expr.empty();
    if (symbolic) {
      // Its sizes are the call's: checked per call where they matter (the inputs', kernels'
      // arguments), evaluated from layouts_, never read from metas_ (zeros there).
      if (plan_.sizes_.empty()) return Invalid(what + " has size expressions, the plan no symbols");
      if (v->meta.size_exprs.size() != meta.sizes.size() ||
          v->meta.stride_exprs.size() != meta.sizes.size()) {
        return Invalid(what + ": its size or stride expressions are not one per dimension");
      }
      SymbolicLayout layout;
      for (const auto* exprs : {&v->meta.size_exprs, &v->meta.stride_exprs}) {
        for (const SymExprSpec& e : *exprs) {
          StatusOr<SizeExpr> compiled = plan_.sizes_.Compile(e);
          if (!compiled.ok()) return Invalid(what + ": " + compiled.status().message());
          (exprs == &v->meta.size_exprs ? layout.sizes : layout.strides)
              .push_back(*std::move(compiled));
        }
      }
      if (v->meta.storage_offset_expr.size() > 1) {
        return Invalid(what + " has more than one storage offset expression");
      }
      if (!v->meta.storage_offset_expr.empty()) {
        if (meta.storage_offset != 0) {
          return Invalid(what + " has a storage offset and its expression");
        }
        StatusOr<SizeExpr> compiled = plan_.sizes_.Compile(v->meta.storage_offset_expr[0]);
        if (!compiled.ok()) return Invalid(what + ": " + compiled.status().message());
        layout.offset = *std::move(compiled);
      }
      plan_.layouts_.push_back(std::move(layout));
      std::fill(meta.sizes.begin(), meta.sizes.end(), 0);
      std::fill(meta.strides.begin(), meta.strides.end(), 0);
    } else {
      plan_.layouts_.emplace_back();
    }
    plan_.symbolic_.push_back(symbolic);
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
  const std::string where = std::string(what) + " " + ValueName(id);
  KILN_RETURN_IF_ERROR(Define(s, what));
  const ValueMeta& m = plan_.metas_[s];
  if (!tensor.defined()) return Invalid(where + " is undefined");
  if (plan_.symbolic_[s]) return Invalid(where + " has symbolic sizes: it is bound once");
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
    const std::string what = "buffer " + ValueName(b.id);
    if (is_buffer_[s] || state_[s] != kUndefined) return Invalid(what + " is defined twice");
    is_buffer_[s] = 1;
    if (!b.in_arena) continue;
    if (plan_.symbolic_[s]) return Invalid(what + " has symbolic sizes and is in the arena");
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
    if (plan_.buffers_[s].in_arena) return Invalid("output " + ValueName(id) + " is an arena buffer");
    plan_.output_slots_.push_back(s);
    is_output_[s] = 1;
  }
  return Status::OK();
}

Status Plan::Builder::Build(const PlanSpec& spec, const PlanBinding& binding) {
  if (spec.arena_bytes > static_cast<uint64_t>(INT64_MAX)) {
    return Invalid("an arena of " + std::to_string(spec.arena_bytes) + " bytes");
  }
  // The per-call inputs (after the bound parameters) give the size symbols their values.
  if (!spec.size_symbols.empty()) {
    const size_t bound = std::min(binding.params.size(), spec.inputs.size());
    const std::vector<uint32_t> per_call(spec.inputs.begin() + static_cast<long>(bound),
                                         spec.inputs.end());
    KILN_ASSIGN_OR_RETURN(plan_.sizes_, PlanSizes::Create(spec.size_symbols, per_call));
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
    if (plan_.symbolic_[s]) return Invalid("prologue output " + ValueName(id) + " is symbolic");
    if (is_output_[s]) return Invalid("prologue output " + ValueName(id) + " is a plan output");
    plan_.prologue_output_slots_.push_back(s);
  }
  plan_.watched_.assign(watched_.begin(), watched_.end());
  for (size_t i = num_params; i < spec.inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(spec.inputs[i]));
    KILN_RETURN_IF_ERROR(Define(s, "input"));
    if (plan_.symbolic_[s]) {
      plan_.sized_inputs_.push_back({i - num_params, plan_.layouts_[s].sizes});
    }
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
      return Invalid(where + ": " + ValueName(u.input) + " is not an input");
    }
    InputUpdate update;
    KILN_ASSIGN_OR_RETURN(update.input_slot, Slot(u.input));
    KILN_ASSIGN_OR_RETURN(update.value_slot, Slot(u.value));
    if (!updated.insert(update.input_slot).second) {
      return Invalid(where + ": " + ValueName(u.input) + " is updated twice");
    }
    KILN_RETURN_IF_ERROR(Require(update.value_slot, where));
    const size_t position = static_cast<size_t>(input - spec.inputs.begin());
    if (position < num_params) {
      // The update writes the caller's parameter, which the steps must be reading themselves.
      const at::Tensor& bound = plan_.bound_[update.input_slot];
      if (!bound.is_same(plan_.originals_[update.input_slot])) {
        return Invalid(where + ": parameter " + ValueName(u.input) +
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
    if (plan_.symbolic_[update.input_slot] || plan_.symbolic_[update.value_slot]) {
      // Sizes that are expressions are compared per call (ApplyInputUpdates), at their values.
      if (update.restride) {
        return Invalid(where + ": a plan with size symbols changes an input's layout");
      }
      if (value.dtype != after.dtype || value.sizes.size() != after.sizes.size()) {
        return Invalid(where + ": " + ValueName(u.value) + " is " + c10::toString(value.dtype) +
                       " of " + std::to_string(value.sizes.size()) + " dims, its input " +
                       c10::toString(after.dtype) + " of " + std::to_string(after.sizes.size()));
      }
    } else if (value.dtype != after.dtype || value.sizes != after.sizes) {
      return Invalid(where + ": " + ValueName(u.value) + " is " +
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
  KeepViewChains(*into);
  return Status::OK();
}

// A view made from metadata (MadeView) has no autograd view metadata: a view the dispatcher made
// of it (a plan output, any op whose result aliases an argument) would name it as its base
// instead of the tensor the program viewed. Such a view's input, and back along a chain of
// views, is made by the dispatcher too.
void Plan::Builder::KeepViewChains(std::vector<Step>& steps) {
  std::unordered_map<int, size_t> made;  // slot -> the step making it from metadata
  for (size_t i = 0; i < steps.size(); ++i) {
    auto* l = std::get_if<LibraryStep>(&steps[i].body);
    if (l == nullptr) continue;
    if (l->view_of >= 0) {
      made[l->outputs[0]] = i;
      continue;
    }
    const auto& returns = l->op.schema().returns();
    if (std::none_of(returns.begin(), returns.end(),
                     [](const c10::Argument& r) { return r.alias_info() != nullptr; })) {
      continue;
    }
    for (const auto& [position, slot] : l->tensor_args) {
      for (int s = slot; made.count(s);) {
        LibraryStep& producer = std::get<LibraryStep>(steps[made[s]].body);
        made.erase(s);
        s = producer.view_of;
        producer.view_of = -1;
      }
    }
  }
}

Status Plan::Builder::KernelStepOf(const KernelStepSpec& k, bool prologue, Step* step) {
  const std::string& where = step->label;
  KernelStep ks{};
  ks.symbol = k.symbol;
  if ((!k.size_args.empty() || k.has_grid_work) && !plan_.symbolic()) {
    return Invalid(where + " takes sizes per call in a plan without size symbols");
  }
  for (const SymExprSpec& e : k.size_args) {
    StatusOr<SizeExpr> compiled = plan_.sizes_.Compile(e);
    if (!compiled.ok()) return Invalid(where + ": " + compiled.status().message());
    ks.size_args.push_back(*std::move(compiled));
  }
  if (k.has_grid_work) {
    if (!plan_.cuda_module_) return Invalid(where + ": a grid per call for a CPU kernel");
    if (k.grid_work_per_block == 0 || k.grid_max == 0) {
      return Invalid(where + ": a grid per call with no work per block or no largest grid");
    }
    StatusOr<SizeExpr> compiled = plan_.sizes_.Compile(k.grid_work);
    if (!compiled.ok()) return Invalid(where + ": " + compiled.status().message());
    ks.grid_work = *std::move(compiled);
    ks.grid_work_per_block = k.grid_work_per_block;
    ks.grid_max = k.grid_max;
  }
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
    if (!is_buffer_[s]) return Invalid(where + " writes " + ValueName(id) + ", not a buffer");
    if (std::find(k.args.begin(), k.args.end(), id) == k.args.end()) {
      return Invalid(where + " writes " + ValueName(id) + ", which is not one of its arguments");
    }
  }
  for (uint32_t id : k.args) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (is_buffer_[s] && state_[s] == kUndefined) {
      if (prologue && plan_.buffers_[s].in_arena) {
        return Invalid(where + ": prologue buffer " + ValueName(id) + " is in the per-call arena");
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
  if (IsPlainView(l.op) && ls.outputs.size() == 1 && !is_output_[ls.outputs[0]] &&
      ls.list_args.empty() && !ls.tensor_args.empty() && ls.tensor_args[0].first == 0) {
    ls.view_of = ls.tensor_args[0].second;
    ls.reshapes = l.op == "aten::view" || l.op == "aten::_unsafe_view";
  }
  auto check_read = [&](int s, size_t position) -> Status {
    KILN_RETURN_IF_ERROR(Require(s, where));
    if (prologue && plan_.originals_[s].defined()) watched_.insert(s);
    if (plan_.buffers_[s].in_arena && MayAlias(formals[position])) {
      return Invalid(where + ": its result may be a view of arena buffer " + ValueName(plan_.ids_[s]));
    }
    return Status::OK();
  };
  for (const auto& [position, s] : ls.tensor_args) KILN_RETURN_IF_ERROR(check_read(s, position));
  for (const auto& list : ls.list_args) {
    for (int s : list.slots) KILN_RETURN_IF_ERROR(check_read(s, list.position));
  }
  for (int s : ls.outputs) {
    if (is_buffer_[s]) return Invalid(where + " defines buffer " + ValueName(plan_.ids_[s]));
    KILN_RETURN_IF_ERROR(Define(s, where));
  }
  step->body = std::move(ls);
  return Status::OK();
}

Status Plan::Builder::Release(const std::vector<uint32_t>& ids, Step* step) {
  for (uint32_t id : ids) {
    KILN_ASSIGN_OR_RETURN(const int s, Slot(id));
    if (is_output_[s]) return Invalid(step->label + " releases plan output " + ValueName(id));
    if (plan_.buffers_[s].in_arena) {
      return Invalid(step->label + " releases arena buffer " + ValueName(id));
    }
    if (state_[s] != kDefined) {
      return Invalid(step->label + " releases " + ValueName(id) + ", which is not live there");
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
    } else if (a.kind == CallArg::Kind::kSymInt || a.kind == CallArg::Kind::kSymInts) {
      const bool list = a.kind == CallArg::Kind::kSymInts;
      const c10::TypePtr type = list ? ListElement(f.type) : f.type;
      // A Scalar takes the int as it takes an int's (arange's end), a Tensor as a wrapped
      // number (arange(n) + s0).
      const bool tensor = !list && IsTensor(type);
      const bool fits = type != nullptr && (IsIntLike(type) || tensor ||
                                            (!list && type->kind() == c10::TypeKind::NumberType));
      if (!fits || (!list && a.exprs.size() != 1)) {
        return Invalid(arg_where + ": a SymInt" + (list ? " list" : "") + " cannot bind to " +
                       f.type->str());
      }
      LibraryStep::SizeArg arg{position, {}, list, tensor};
      for (const SymExprSpec& e : a.exprs) {
        StatusOr<SizeExpr> compiled = plan_.sizes_.Compile(e);
        if (!compiled.ok()) return Invalid(arg_where + ": " + compiled.status().message());
        arg.exprs.push_back(*std::move(compiled));
      }
      step.size_args.push_back(std::move(arg));
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


}  // namespace kiln::runtime
