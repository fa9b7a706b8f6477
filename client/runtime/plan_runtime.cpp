// Building a Plan (slots, checks of the whole plan, kernel symbols, schema binding) and running
// it: the per-call path of compiled graphs, with no Python on it.
#include "runtime/plan_runtime.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/record_function.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/Scalar.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_set>

namespace kiln::runtime {
namespace {

[[noreturn]] void BuildError(const std::string& message) {
  throw std::invalid_argument("kiln plan: " + message);
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

// The enum payloads (dtype, layout, memory_format) travel as ints, which is also how IValue
// holds them; only the range needs checking.
c10::IValue EnumValue(int64_t value, int64_t limit, const char* what, const std::string& where) {
  if (value < 0 || value >= limit) {
    BuildError(where + ": " + std::to_string(value) + " is not a " + what);
  }
  return value;
}

c10::Device ParseDevice(const std::string& text, const std::string& where) {
  try {
    return c10::Device(text);
  } catch (const c10::Error& e) {
    BuildError(where + ": bad device '" + text + "': " + e.what_without_backtrace());
  }
}

// The IValue of a non-tensor argument, typed for the schema argument it binds to; throws
// (naming `where`) when the payload cannot take that type.
c10::IValue ConvertConstant(const CallArg& a, const c10::Argument& formal,
                            const std::string& where) {
  using K = CallArg::Kind;
  using TK = c10::TypeKind;
  const FormalType f = Unwrap(formal);
  const TK kind = f.type->kind();
  const c10::TypePtr element = ListElement(f.type);
  auto mismatch = [&](const char* payload) -> c10::IValue {
    BuildError(where + ": " + payload + " cannot bind to " + formal.real_type()->str());
  };
  switch (a.kind) {
    case K::kNone:
      if (f.optional || kind == TK::NoneType) return c10::IValue();
      return mismatch("None");
    case K::kInt:
      if (IsIntLike(f.type)) return a.i;
      if (IsFloatLike(f.type)) return static_cast<double>(a.i);
      if (kind == TK::NumberType) return c10::Scalar(a.i);  // An int Scalar.
      if (kind == TK::TensorType) return WrappedNumber(c10::Scalar(a.i));
      if (kind == TK::ScalarTypeType || kind == TK::LayoutType || kind == TK::MemoryFormatType) {
        return a.i;
      }
      if (element != nullptr && IsIntLike(element) && formal.N()) {
        // int[2] stride given as 2: Python's argument parser repeats it N times.
        return c10::List<int64_t>(std::vector<int64_t>(static_cast<size_t>(*formal.N()), a.i));
      }
      return mismatch("an int");
    case K::kFloat:
      if (IsFloatLike(f.type)) return a.f;
      if (kind == TK::NumberType) return c10::Scalar(a.f);  // A double Scalar.
      if (kind == TK::TensorType) return WrappedNumber(c10::Scalar(a.f));
      return mismatch("a float");
    case K::kBool:
      if (kind == TK::BoolType || kind == TK::SymBoolType) return a.b;
      if (kind == TK::NumberType) return c10::Scalar(a.b);
      if (kind == TK::TensorType) return WrappedNumber(c10::Scalar(a.b));
      return mismatch("a bool");
    case K::kInts:
      if (element != nullptr && IsIntLike(element)) return c10::List<int64_t>(a.list);
      if (element != nullptr && IsFloatLike(element)) {
        return c10::List<double>(std::vector<double>(a.list.begin(), a.list.end()));
      }
      if (element != nullptr &&
          (element->kind() == TK::NumberType ||
           (element->kind() == TK::OptionalType &&
            element->castRaw<c10::OptionalType>()->getElementType()->kind() == TK::NumberType))) {
        c10::impl::GenericList scalars(element);  // Scalar[] / Scalar?[] (mkldnn's scalars)
        for (int64_t v : a.list) scalars.push_back(c10::Scalar(v));
        return scalars;
      }
      if (element != nullptr && element->kind() == TK::BoolType) {
        c10::List<bool> bools;
        for (int64_t v : a.list) bools.push_back(v != 0);
        return bools;
      }
      return mismatch("an int list");
    case K::kDtype:
      if (kind == TK::ScalarTypeType || kind == TK::IntType) {
        return EnumValue(a.i, static_cast<int64_t>(c10::ScalarType::NumOptions), "ScalarType",
                         where);
      }
      return mismatch("a dtype");
    case K::kLayout:
      if (kind == TK::LayoutType || kind == TK::IntType) {
        return EnumValue(a.i, static_cast<int64_t>(c10::Layout::NumOptions), "Layout", where);
      }
      return mismatch("a layout");
    case K::kMemoryFormat:
      if (kind == TK::MemoryFormatType || kind == TK::IntType) {
        return EnumValue(a.i, static_cast<int64_t>(c10::MemoryFormat::NumOptions), "MemoryFormat",
                         where);
      }
      return mismatch("a memory format");
    case K::kStr:
      if (kind == TK::StringType) return a.s;
      return mismatch("a str");
    case K::kDevice:
      if (kind != TK::DeviceObjType) return mismatch("a device");
      return ParseDevice(a.s, where);
    case K::kValue:
    case K::kValues:
      break;
  }
  BuildError(where + ": internal: a tensor argument bound as a constant");
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

// Elements of storage a tensor with this metadata reaches (storage offset included).
int64_t StorageElements(const ValueMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return m.storage_offset;
    extent += (m.sizes[d] - 1) * m.strides[d];
  }
  return m.storage_offset + extent;
}

// A new tensor with exactly the metadata's sizes, strides and storage offset.
at::Tensor EmptyWithLayout(const ValueMeta& m, const at::TensorOptions& options) {
  if (m.storage_offset == 0) return at::empty_strided(m.sizes, m.strides, options);
  return at::empty({StorageElements(m)}, options).as_strided(m.sizes, m.strides, m.storage_offset);
}

bool HasLayout(const at::Tensor& t, const ValueMeta& m) {
  return t.strides() == c10::IntArrayRef(m.strides) && t.storage_offset() == m.storage_offset;
}

// Whether an argument may be aliased by the op's result (a view: "Tensor(a) self").
bool MayAlias(const c10::Argument& formal) {
  return formal.alias_info() != nullptr && !formal.alias_info()->isWrite();
}

}  // namespace

Plan::~Plan() = default;

int Plan::Slot(uint32_t id) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) BuildError("the plan uses " + Id(id) + " without metadata");
  return static_cast<int>(it - ids_.begin());
}

Plan::Plan(PlanSpec spec) : arena_bytes_(spec.arena_bytes), device_(spec.device) {
  // Slots: the ids of `values`, sorted, so Slot() is a binary search at build time only.
  std::sort(spec.values.begin(), spec.values.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [id, meta] : spec.values) {
    if (!ids_.empty() && ids_.back() == id) BuildError(Id(id) + " has metadata twice");
    const std::string what = Id(id);
    if (meta.dtype == at::ScalarType::Undefined ||
        static_cast<int>(meta.dtype) >= static_cast<int>(at::ScalarType::NumOptions)) {
      BuildError(what + " has no valid dtype");
    }
    if (meta.sizes.size() != meta.strides.size()) {
      BuildError(what + ": sizes and strides differ in rank");
    }
    if (std::any_of(meta.sizes.begin(), meta.sizes.end(), [](int64_t v) { return v < 0; }) ||
        std::any_of(meta.strides.begin(), meta.strides.end(), [](int64_t v) { return v < 0; }) ||
        meta.storage_offset < 0) {
      BuildError(what + " has a negative size, stride or storage offset");
    }
    ids_.push_back(id);
    metas_.push_back(std::move(meta));
  }
  const size_t n = ids_.size();
  bound_.resize(n);
  originals_.resize(n);
  buffers_.resize(n);

  // Definition state of each slot while the steps are checked in order.
  enum State : char { kUndefined, kDefined, kReleased };
  std::vector<char> state(n, kUndefined);
  std::vector<char> is_buffer(n, 0), written(n, 0), is_output(n, 0);
  auto define = [&](int s, const std::string& where) {
    if (state[s] != kUndefined) BuildError(where + ": " + Id(ids_[s]) + " is defined twice");
    state[s] = kDefined;
  };
  auto require = [&](int s, const std::string& where) {
    if (state[s] == kReleased) {
      BuildError(where + ": " + Id(ids_[s]) + " is used after its release");
    }
    if (state[s] != kDefined || (is_buffer[s] && !written[s])) {
      BuildError(where + ": " + Id(ids_[s]) + " is used before it is computed");
    }
  };

  for (auto& [id, tensor] : spec.constants) {
    const int s = Slot(id);
    define(s, "constant");
    const ValueMeta& m = metas_[s];
    if (!tensor.defined()) BuildError("constant " + Id(id) + " is undefined");
    if (tensor.scalar_type() != m.dtype || tensor.sizes() != c10::IntArrayRef(m.sizes)) {
      BuildError("constant " + Id(id) + " is " +
                 Describe(tensor.scalar_type(), tensor.sizes(), tensor.strides()) +
                 ", its metadata says " + Describe(m.dtype, m.sizes, m.strides));
    }
    at::Tensor t = tensor.to(device_);
    if (!HasLayout(t, m)) {
      at::Tensor copy = EmptyWithLayout(m, t.options());
      copy.copy_(t);
      t = std::move(copy);
    }
    bound_[s] = std::move(t);
    originals_[s] = tensor;
  }
  for (const BufferSpec& b : spec.buffers) {
    const int s = Slot(b.id);
    const std::string what = "buffer " + Id(b.id);
    if (is_buffer[s] || state[s] != kUndefined) BuildError(what + " is defined twice");
    is_buffer[s] = 1;
    if (!b.in_arena) continue;
    const ValueMeta& m = metas_[s];
    const auto element = static_cast<uint64_t>(c10::elementSize(m.dtype));
    const uint64_t end = b.arena_offset + static_cast<uint64_t>(StorageElements(m)) * element;
    if (b.arena_offset % 64 != 0) BuildError(what + ": arena offset is not a multiple of 64");
    if (end > arena_bytes_ || end < b.arena_offset) {
      BuildError(what + " ends at byte " + std::to_string(end) + " of an arena of " +
                 std::to_string(arena_bytes_));
    }
    buffers_[s].in_arena = true;
    buffers_[s].arena_element_offset =
        static_cast<int64_t>(b.arena_offset / element) + m.storage_offset;
  }
  for (uint32_t id : spec.outputs) {
    const int s = Slot(id);
    if (buffers_[s].in_arena) BuildError("output " + Id(id) + " is an arena buffer");
    output_slots_.push_back(s);
    is_output[s] = 1;
  }

  auto is_kernel = [](const auto& s) { return std::holds_alternative<KernelStepSpec>(s); };
  const bool has_kernels = std::any_of(spec.steps.begin(), spec.steps.end(), is_kernel) ||
                           std::any_of(spec.prologue.begin(), spec.prologue.end(), is_kernel);
  if (has_kernels) {
    if (device_.type() != c10::kCPU) {
      BuildError("kernel steps need a CPU plan; this plan is for " + device_.str());
    }
    if (spec.kernel_binary.empty()) BuildError("the plan launches kernels but has no binary");
    try {
      library_ = std::make_unique<KernelLibrary>(spec.kernel_binary);
    } catch (const std::exception& e) {
      BuildError(e.what());
    }
  }

  std::set<int> watched;  // constant slots the prologue reads
  auto build_steps = [&](const std::vector<std::variant<KernelStepSpec, LibraryStepSpec>>& specs,
                         const std::string& list, bool prologue, std::vector<Step>& into) {
    for (size_t i = 0; i < specs.size(); ++i) {
      Step step;
      const std::vector<uint32_t>* release = nullptr;
      if (const auto* k = std::get_if<KernelStepSpec>(&specs[i])) {
        step.label = list + " " + std::to_string(i) + " (kernel " + k->symbol + ")";
        const std::string& where = step.label;
        KernelStep ks{};
        ks.symbol = k->symbol;
        try {
          ks.fn = library_->Resolve(k->symbol);
        } catch (const std::exception& e) {
          BuildError(where + ": " + e.what());
        }
        const std::unordered_set<uint32_t> writes(k->writes.begin(), k->writes.end());
        for (uint32_t id : k->writes) {
          if (!is_buffer[Slot(id)]) BuildError(where + " writes " + Id(id) + ", not a buffer");
          if (std::find(k->args.begin(), k->args.end(), id) == k->args.end()) {
            BuildError(where + " writes " + Id(id) + ", which is not one of its arguments");
          }
        }
        for (uint32_t id : k->args) {
          const int s = Slot(id);
          if (is_buffer[s] && state[s] == kUndefined) {
            if (prologue && buffers_[s].in_arena) {
              BuildError(where + ": prologue buffer " + Id(id) + " is in the per-call arena");
            }
            state[s] = kDefined;
            step.allocate.push_back(s);
          }
          if (!writes.count(id)) require(s, where);
          if (prologue && originals_[s].defined()) watched.insert(s);
          if (state[s] == kReleased) require(s, where);
          ks.slots.push_back(s);
          // Constants are checked too: a parameter bound as one can be resized in place later.
          ks.checked.push_back(!is_buffer[s]);
        }
        for (uint32_t id : k->writes) written[Slot(id)] = 1;
        step.body = std::move(ks);
        release = &k->release;
        ++num_kernels_;
      } else {
        const auto& l = std::get<LibraryStepSpec>(specs[i]);
        step.label = list + " " + std::to_string(i) + " (" + l.op + ")";
        const std::string& where = step.label;
        LibraryStep ls = BindLibrary(l, where);
        const auto& formals = ls.op.schema().arguments();
        auto check_read = [&](int s, size_t position) {
          require(s, where);
          if (prologue && originals_[s].defined()) watched.insert(s);
          if (buffers_[s].in_arena && MayAlias(formals[position])) {
            BuildError(where + ": its result may be a view of arena buffer " + Id(ids_[s]));
          }
        };
        for (const auto& [position, s] : ls.tensor_args) check_read(s, position);
        for (const auto& list : ls.list_args) {
          for (int s : list.slots) check_read(s, list.position);
        }
        for (int s : ls.outputs) {
          if (is_buffer[s]) BuildError(where + " defines buffer " + Id(ids_[s]));
          define(s, where);
        }
        step.body = std::move(ls);
        release = &l.release;
        ++num_library_calls_;
      }
      for (uint32_t id : *release) {
        const int s = Slot(id);
        if (is_output[s]) BuildError(step.label + " releases plan output " + Id(id));
        if (buffers_[s].in_arena) BuildError(step.label + " releases arena buffer " + Id(id));
        if (state[s] != kDefined) {
          BuildError(step.label + " releases " + Id(id) + ", which is not live there");
        }
        state[s] = kReleased;
        step.release.push_back(s);
      }
      into.push_back(std::move(step));
    }
  };
  // The prologue reads bound values only: the per-call inputs are defined after it.
  build_steps(spec.prologue, "prologue step", true, prologue_);
  for (uint32_t id : spec.prologue_outputs) {
    const int s = Slot(id);
    require(s, "prologue output");
    if (is_output[s]) BuildError("prologue output " + Id(id) + " is a plan output");
    prologue_output_slots_.push_back(s);
  }
  for (int s : watched) watched_.push_back(s);
  for (uint32_t id : spec.inputs) {
    const int s = Slot(id);
    define(s, "input");
    input_slots_.push_back(s);
  }
  build_steps(spec.steps, "step", false, steps_);
  for (int s : output_slots_) require(s, "output");
}

Plan::LibraryStep Plan::BindLibrary(const LibraryStepSpec& spec, const std::string& where) const {
  auto [name, overload] = SplitOpName(spec.op);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) BuildError(where + ": no such operator in the dispatcher");
  const c10::FunctionSchema& schema = handle->schema();
  const auto& formals = schema.arguments();
  LibraryStep step{*handle, std::vector<c10::IValue>(formals.size()), {}, {}, {}};

  std::vector<char> bound(formals.size(), 0);
  size_t next_positional = 0;
  bool seen_named = false;
  for (const CallArg& a : spec.args) {
    size_t position;
    if (a.name.empty()) {
      if (seen_named) BuildError(where + ": a positional argument follows a named one");
      position = next_positional++;
      if (position >= formals.size()) {
        BuildError(where + ": more than " + std::to_string(formals.size()) +
                   " positional arguments");
      }
    } else {
      seen_named = true;
      auto it = std::find_if(formals.begin(), formals.end(),
                             [&](const c10::Argument& f) { return f.name() == a.name; });
      if (it == formals.end()) BuildError(where + ": the schema has no argument '" + a.name + "'");
      position = static_cast<size_t>(it - formals.begin());
    }
    const c10::Argument& formal = formals[position];
    const std::string arg_where = where + ", argument '" + formal.name() + "'";
    if (bound[position]) BuildError(arg_where + " is given twice");
    bound[position] = 1;
    const FormalType f = Unwrap(formal);
    if (a.kind == CallArg::Kind::kValue) {
      if (!IsTensor(f.type)) BuildError(arg_where + ": a tensor cannot bind to " + f.type->str());
      step.tensor_args.emplace_back(position, Slot(static_cast<uint32_t>(a.i)));
    } else if (a.kind == CallArg::Kind::kValues) {
      const c10::TypePtr element = ListElement(f.type);
      bool optional_elements = false;
      if (element != nullptr && !IsTensor(element)) {
        auto opt = element->cast<c10::OptionalType>();
        optional_elements = opt != nullptr && IsTensor(opt->getElementType());
      }
      if (element == nullptr || (!IsTensor(element) && !optional_elements)) {
        BuildError(arg_where + ": a tensor list cannot bind to " + f.type->str());
      }
      std::vector<int> slots;
      for (int64_t id : a.list) slots.push_back(Slot(static_cast<uint32_t>(id)));
      step.list_args.push_back({position, std::move(slots), optional_elements});
    } else {
      step.stack[position] = ConvertConstant(a, formal, arg_where);
    }
  }
  for (size_t position = 0; position < formals.size(); ++position) {
    if (bound[position]) continue;
    if (!formals[position].default_value()) {
      BuildError(where + ": required argument '" + formals[position].name() + "' is missing");
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
    } else {
      BuildError(where + ": returns " + r.real_type()->str() + ", not tensors");
    }
  }
  if (!list_return && fixed_returns != spec.outputs.size()) {
    BuildError(where + ": returns " + std::to_string(fixed_returns) + " tensors, the plan names " +
               std::to_string(spec.outputs.size()));
  }
  for (uint32_t id : spec.outputs) step.outputs.push_back(Slot(id));
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
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(arena.storage()), arena.key_set(), c10::scalarTypeToTypeMeta(m.dtype));
  impl->set_sizes_and_strides(m.sizes, m.strides, buffers_[slot].arena_element_offset);
  return at::Tensor(std::move(impl));
}

namespace {

// The parallel_for of the kernel ABI: torch's intra-op thread pool (at::parallel_for), so
// kernels share torch's threads and its set_num_threads.
void ParallelFor(int64_t begin, int64_t end, int64_t grain, KernelRangeFn fn, void* const* args) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(b, e, args); });
}

}  // namespace

void Plan::RunKernel(const KernelStep& k, std::vector<at::Tensor>& vals) const {
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
      throw std::runtime_error("argument " + std::to_string(i) + " (" + Id(ids_[s]) +
                               ") is undefined");
    }
    if (k.checked[i]) {
      const ValueMeta& m = metas_[s];
      if (t->device().type() != device_.type() || t->scalar_type() != m.dtype ||
          t->sizes() != c10::IntArrayRef(m.sizes)) {
        throw std::runtime_error(Id(ids_[s]) + " is " +
                                 Describe(t->scalar_type(), t->sizes(), t->strides()) + " on " +
                                 t->device().str() + ", the kernel was built for " +
                                 Describe(m.dtype, m.sizes, m.strides) + " on " + device_.str());
      }
      if (!HasLayout(*t, m)) {
        // The kernel's index arithmetic has the metadata's strides built in.
        at::Tensor copy = EmptyWithLayout(m, t->options());
        copy.copy_(*t);
        relaid.push_back(std::move(copy));
        t = &relaid.back();
      }
    }
    pointers[i] = t->data_ptr();
  }
  // Visible to torch.profiler beside the library ops; costs a flag test when nothing records.
  RECORD_FUNCTION(k.symbol, c10::ArrayRef<const c10::IValue>{});
  k.fn(pointers, &ParallelFor);
}

void Plan::RunLibrary(const LibraryStep& l, std::vector<at::Tensor>& vals) const {
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
    if (!v.isTensor() && !v.isNone()) throw std::runtime_error("returned a non-tensor");
    if (next >= l.outputs.size()) throw std::runtime_error("returned more tensors than expected");
    vals[l.outputs[next++]] = v.isTensor() ? v.toTensor() : at::Tensor();
  };
  for (const c10::IValue& v : stack) {
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) take(t);
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) take(e);
    } else {
      take(v);
    }
  }
  if (next != l.outputs.size()) {
    throw std::runtime_error("returned " + std::to_string(next) + " tensors, the plan names " +
                             std::to_string(l.outputs.size()));
  }
}

void Plan::RunSteps(const std::vector<Step>& steps, std::vector<at::Tensor>& vals,
                    const at::Tensor& arena) const {
  const Step* step = nullptr;
  try {
    for (const Step& s : steps) {
      step = &s;
      for (int b : s.allocate) vals[b] = AllocateBuffer(b, arena);
      if (const auto* k = std::get_if<KernelStep>(&s.body)) {
        RunKernel(*k, vals);
      } else {
        RunLibrary(std::get<LibraryStep>(s.body), vals);
      }
      for (int r : s.release) vals[r].reset();
    }
  } catch (const c10::Error& e) {
    throw std::runtime_error("kiln plan: " + step->label + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("kiln plan: " + step->label + ": " + e.what());
  }
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

std::shared_ptr<const std::vector<at::Tensor>> Plan::PrologueValues() const {
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
  RunSteps(prologue_, vals, at::Tensor());
  auto kept = std::make_shared<std::vector<at::Tensor>>();
  kept->reserve(prologue_output_slots_.size());
  for (int s : prologue_output_slots_) kept->push_back(vals[s]);
  prologue_values_ = std::move(kept);
  prologue_stamps_ = std::move(now);
  return prologue_values_;
}

std::vector<at::Tensor> Plan::Run(const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != input_slots_.size()) {
    throw std::runtime_error("kiln plan: takes " + std::to_string(input_slots_.size()) +
                             " inputs, got " + std::to_string(inputs.size()));
  }
  std::vector<at::Tensor> vals = bound_;
  if (!prologue_.empty()) {
    std::shared_ptr<const std::vector<at::Tensor>> kept = PrologueValues();
    for (size_t i = 0; i < prologue_output_slots_.size(); ++i) {
      vals[prologue_output_slots_[i]] = (*kept)[i];
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) vals[input_slots_[i]] = inputs[i];
  at::Tensor arena;
  if (arena_bytes_ > 0) {
    try {
      const auto bytes = static_cast<int64_t>(arena_bytes_);
      arena = device_.is_cpu()
                  ? at::Tensor(at::detail::empty_cpu({bytes}, at::kByte))
                  : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    } catch (const c10::Error& e) {
      throw std::runtime_error(std::string("kiln plan: arena: ") + e.what_without_backtrace());
    }
  }
  RunSteps(steps_, vals, arena);
  std::vector<at::Tensor> outputs;
  outputs.reserve(output_slots_.size());
  for (int s : output_slots_) outputs.push_back(vals[s]);
  return outputs;
}

}  // namespace kiln::runtime
