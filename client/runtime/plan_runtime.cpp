// Running a Plan: the per-call path of compiled graphs, with no Python on it. (Building one:
// plan_builder.cpp.)
#include "runtime/plan_runtime.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorUtils.h>
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

#include "runtime/value_layout.h"
#include "runtime/wire_types.h"

#ifdef KILN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace kiln::runtime {

StatusOr<const ValueMeta*> Plan::MetaAt(int s, const std::vector<int64_t>* symbols,
                                         ValueMeta* scratch) const {
  if (!symbolic_[s]) return &metas_[s];
  if (symbols == nullptr) return Status::RuntimeError("internal: a symbolic value without symbols");
  ValueMeta& m = *scratch;
  m = metas_[s];
  const SymbolicLayout& layout = layouts_[s];
  for (size_t d = 0; d < layout.sizes.size(); ++d) {
    KILN_ASSIGN_OR_RETURN(m.sizes[d], PlanSizes::Evaluate(layout.sizes[d], *symbols));
    KILN_ASSIGN_OR_RETURN(m.strides[d], PlanSizes::Evaluate(layout.strides[d], *symbols));
    if (m.sizes[d] < 0 || m.strides[d] < 0) {
      return Status::RuntimeError(ValueName(ids_[s]) + " has a negative size or stride here");
    }
  }
  if (layout.offset) {
    KILN_ASSIGN_OR_RETURN(m.storage_offset, PlanSizes::Evaluate(*layout.offset, *symbols));
    if (m.storage_offset < 0) {
      return Status::RuntimeError(ValueName(ids_[s]) + " has a negative storage offset here");
    }
  }
  if (!CheckedStorageBytes(m)) {
    return Status::RuntimeError(ValueName(ids_[s]) + " spans more bytes than int64_t counts");
  }
  return &m;
}

at::Tensor Plan::AllocateBuffer(int slot, const at::Tensor& arena,
                                const std::vector<int64_t>* symbols) const {
  // A symbolic buffer is sized per call (never in the arena: Create checked).
  ValueMeta scratch;
  StatusOr<const ValueMeta*> at_call = MetaAt(slot, symbols, &scratch);
  if (!at_call.ok()) throw std::runtime_error(std::string(at_call.status().message()));
  const ValueMeta& m = **at_call;
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

Status Plan::RunKernel(const KernelStep& k, std::vector<at::Tensor>& vals,
                       const std::vector<int64_t>* symbols) const {
  constexpr size_t kInline = 16;
  std::array<void*, kInline> inline_pointers;
  std::vector<void*> heap_pointers;
  void** pointers = inline_pointers.data();
  const size_t n = k.slots.size() + k.size_args.size();
  if (n > kInline) {
    heap_pointers.resize(n);
    pointers = heap_pointers.data();
  }
  // The integers after the pointers: a CPU kernel gets a pointer to each, a CUDA kernel the
  // value itself (cuLaunchKernel copies 8 bytes from each slot for an int64_t parameter).
  std::array<int64_t, 4> inline_sizes{};
  std::vector<int64_t> heap_sizes;
  int64_t* sizes = inline_sizes.data();
  if (k.size_args.size() > inline_sizes.size()) {
    heap_sizes.resize(k.size_args.size());
    sizes = heap_sizes.data();
  }
  for (size_t i = 0; i < k.size_args.size(); ++i) {
    if (symbols == nullptr) return Status::RuntimeError("internal: a size argument without symbols");
    KILN_ASSIGN_OR_RETURN(sizes[i], PlanSizes::Evaluate(k.size_args[i], *symbols));
    void*& slot = pointers[k.slots.size() + i];
    if (cuda_module_) {
      std::memcpy(&slot, &sizes[i], sizeof(int64_t));
    } else {
      slot = &sizes[i];
    }
  }
  // Copies made for this launch only: the value table keeps the caller's tensor, so an output
  // that names an input is still that input. (Their data pointers are taken before the next
  // push_back; moving a Tensor does not move its data.)
  std::vector<at::Tensor> relaid;
  for (size_t i = 0; i < k.slots.size(); ++i) {
    const int s = k.slots[i];
    const at::Tensor* t = &vals[s];
    if (!t->defined()) {
      return Status::RuntimeError("argument " + std::to_string(i) + " (" + ValueName(ids_[s]) +
                                  ") is undefined");
    }
    if (k.checked[i]) {
      ValueMeta scratch;
      KILN_ASSIGN_OR_RETURN(const ValueMeta* at_call, MetaAt(s, symbols, &scratch));
      const ValueMeta& m = *at_call;
      if (t->device().type() != device_.type() || t->scalar_type() != m.dtype ||
          t->sizes() != c10::IntArrayRef(m.sizes) ||
          (cuda_module_ && t->device().index() != device_.index())) {
        return Status::RuntimeError(ValueName(ids_[s]) + " is " +
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
  if (cuda_module_) return LaunchCuda(k, pointers, n, symbols);
  k.fn(pointers, &ParallelFor);
  return Status::OK();
}

Status Plan::LaunchCuda(const KernelStep& k, void* const* pointers, size_t n,
                        const std::vector<int64_t>* symbols) const {
#ifdef KILN_WITH_CUDA
  // Run's device guard made the plan's device current: this is the caller's stream on it.
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  if (!k.grid_work) return cuda_module_->Launch(k.cuda, pointers, n, stream);
  if (symbols == nullptr) return Status::RuntimeError("internal: a grid per call without symbols");
  KILN_ASSIGN_OR_RETURN(const int64_t work, PlanSizes::Evaluate(*k.grid_work, *symbols));
  if (work <= 0) return Status::OK();  // nothing to compute: no launch (a 0 grid is an error)
  CudaKernel launch = k.cuda;
  const int64_t per_block = k.grid_work_per_block;
  launch.grid[0] = static_cast<uint32_t>(
      std::clamp<int64_t>(work / per_block + (work % per_block != 0), 1, k.grid_max));
  return cuda_module_->Launch(launch, pointers, n, stream);
#else
  (void)k, (void)pointers, (void)n, (void)symbols;  // Create refuses CUDA kernels without CUDA.
  return Status::RuntimeError("kiln._C was built without CUDA");
#endif
}

Status Plan::RunLibrary(const LibraryStep& l, std::vector<at::Tensor>& vals,
                        const std::vector<int64_t>* symbols) const {
  std::vector<c10::IValue> stack = l.stack;
  for (const LibraryStep::SizeArg& arg : l.size_args) {
    if (symbols == nullptr) return Status::RuntimeError("internal: a SymInt without symbols");
    if (!arg.list) {
      KILN_ASSIGN_OR_RETURN(const int64_t v, PlanSizes::Evaluate(arg.exprs[0], *symbols));
      stack[arg.position] = arg.tensor ? c10::IValue(WrappedNumber(c10::Scalar(v))) : v;
      continue;
    }
    c10::List<int64_t> values;
    values.reserve(arg.exprs.size());
    for (const SizeExpr& e : arg.exprs) {
      KILN_ASSIGN_OR_RETURN(const int64_t v, PlanSizes::Evaluate(e, *symbols));
      values.push_back(v);
    }
    stack[arg.position] = std::move(values);
  }
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
      vals[s] = symbolic_[s] ? vals[s].to(metas_[s].dtype)
                             : CopyWithLayout(vals[s], metas_[s], metas_[s].dtype);
    } else if (l.relayout && vals[s].defined() && !symbolic_[s] && !HasLayout(vals[s], metas_[s])) {
      // (A symbolic value is read by library calls only, which take any layout, as eager's do.)
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

at::Tensor Plan::MadeView(const LibraryStep& l, const std::vector<at::Tensor>& vals,
                          const std::vector<int64_t>* symbols) const {
  const at::Tensor& in = vals[l.view_of];
  if (!in.defined() || in.layout() != at::kStrided || !in.has_storage() ||
      (in.requires_grad() && at::GradMode::is_enabled())) {
    return at::Tensor();
  }
  ValueMeta in_scratch, out_scratch;
  StatusOr<const ValueMeta*> im_at = MetaAt(l.view_of, symbols, &in_scratch);
  StatusOr<const ValueMeta*> om_at = MetaAt(l.outputs[0], symbols, &out_scratch);
  if (!im_at.ok() || !om_at.ok()) return at::Tensor();
  const ValueMeta* im = *im_at;
  const ValueMeta* om = *om_at;
  if (om->dtype != im->dtype || in.scalar_type() != im->dtype ||
      in.sizes() != c10::IntArrayRef(im->sizes) || in.strides() != c10::IntArrayRef(im->strides)) {
    return at::Tensor();
  }
  if (l.reshapes) {
    // Where the input cannot be viewed with the new sizes the op raises, and where it can, its
    // strides are these: the dispatcher runs it unless the metadata says the same.
    const std::optional<std::vector<int64_t>> strides =
        at::detail::computeStride(in.sizes(), in.strides(), om->sizes);
    if (!strides || *strides != om->strides) return at::Tensor();
  }
  const int64_t offset = in.storage_offset() + om->storage_offset - im->storage_offset;
  if (offset < 0) return at::Tensor();
  // Never past the input's storage, whatever the metadata says.
  int64_t last = offset;
  for (size_t d = 0; d < om->sizes.size(); ++d) {
    if (om->sizes[d] == 0) return at::Tensor();  // empty: the dispatcher's result is as cheap
    last += (om->sizes[d] - 1) * om->strides[d];
  }
  if ((last + 1) * static_cast<int64_t>(in.element_size()) >
      static_cast<int64_t>(in.storage().nbytes())) {
    return at::Tensor();
  }
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(in.storage()), in.key_set(),
                                                   in.dtype());
  impl->set_sizes_and_strides(om->sizes, om->strides, offset);
  impl->set_version_counter(in.unsafeGetTensorImpl()->version_counter());
  return at::Tensor(std::move(impl));
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
                      const at::Tensor& arena, std::vector<at::Tensor>* host,
                      const std::vector<int64_t>* symbols) const {
  // The graph was traced with autocast applied: its casts are steps of the plan. Autocast left on
  // would cast the library calls' arguments again (a float32 step given bfloat16 results).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const Step* step = nullptr;
  Status status;
  // ATen reports failures by throwing c10::Error: caught here, once per run, not per step.
  try {
    for (const Step& s : steps) {
      step = &s;
      for (int b : s.allocate) vals[b] = AllocateBuffer(b, arena, symbols);
      if (const auto* k = std::get_if<KernelStep>(&s.body)) {
        status = RunKernel(*k, vals, symbols);
      } else if (const auto& l = std::get<LibraryStep>(s.body);
                 host != nullptr && SmallEnoughForHost(l, vals)) {
        status = RunLibraryOnHost(l, vals, *host);
      } else if (at::Tensor view; l.view_of >= 0 && (view = MadeView(l, vals, symbols)).defined()) {
        // (A symbolic plan runs every view of its graph per call: through the dispatcher, each
        // costs more than the kernels around it at small sizes.)
        vals[l.outputs[0]] = std::move(view);
      } else {
        status = RunLibrary(l, vals, symbols);
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
    std::vector<int64_t> symbols;
    if (symbolic()) {
      KILN_ASSIGN_OR_RETURN(symbols, BindSizes(inputs));
    }
    at::Tensor arena;
    if (arena_bytes_ > 0) {
      const auto bytes = static_cast<int64_t>(arena_bytes_);
      arena = device_.is_cpu()
                  ? at::Tensor(at::detail::empty_cpu({bytes}, at::kByte))
                  : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    }
    KILN_RETURN_IF_ERROR(RunSteps(steps_, vals, arena, nullptr, symbolic() ? &symbols : nullptr));
    if (!input_updates_.empty()) {
      KILN_RETURN_IF_ERROR(ApplyInputUpdates(vals, inputs, symbolic() ? &symbols : nullptr));
    }
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

StatusOr<std::vector<int64_t>> Plan::BindSizes(const std::vector<at::Tensor>& inputs) const {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> symbols,
                        sizes_.Bind([&](size_t i, uint32_t dim) -> std::optional<int64_t> {
                          const at::Tensor& t = inputs[i];
                          if (!t.defined() || dim >= static_cast<uint32_t>(t.dim())) {
                            return std::nullopt;
                          }
                          return t.size(static_cast<int64_t>(dim));
                        }));
  // The guards that chose this plan imply these sizes; a call that disagrees runs no step.
  for (const SizedInput& in : sized_inputs_) {
    const at::Tensor& t = inputs[in.index];
    std::vector<int64_t> expected;
    for (const SizeExpr& e : in.sizes) {
      KILN_ASSIGN_OR_RETURN(const int64_t v, PlanSizes::Evaluate(e, symbols));
      expected.push_back(v);
    }
    if (!t.defined() || t.sizes() != c10::IntArrayRef(expected)) {
      return Status::RuntimeError(
          "kiln plan: input " + std::to_string(in.index) + " has sizes " +
          (t.defined() ? Describe(t.scalar_type(), t.sizes(), t.strides()) : "(undefined)") +
          ", the plan's size symbols make them " +
          Describe(metas_[input_slots_[in.index]].dtype, expected, {}));
    }
  }
  return symbols;
}

Status Plan::ApplyInputUpdates(const std::vector<at::Tensor>& vals,
                               const std::vector<at::Tensor>& inputs,
                               const std::vector<int64_t>* symbols) const {
  // Every check before the first write: a plan that fails here leaves the inputs as they were,
  // so that the eager fallback runs the graph on what the caller passed.
  std::vector<at::Tensor> targets, sources;
  // Each input's layout at this call: its metadata, or a symbolic one's evaluated into scratch.
  std::vector<ValueMeta> scratch(symbols != nullptr ? input_updates_.size() : 0);
  std::vector<const ValueMeta*> layouts(input_updates_.size());
  for (size_t i = 0; i < input_updates_.size(); ++i) {
    const InputUpdate& u = input_updates_[i];
    // Built only for a failure's message: this runs on every call.
    const auto where = [&] {
      return "kiln plan: input update of " + ValueName(ids_[u.input_slot]) + ": ";
    };
    const at::Tensor& target =
        u.call_index >= 0 ? inputs[static_cast<size_t>(u.call_index)] : originals_[u.input_slot];
    const at::Tensor& value = vals[u.value_slot];
    if (!target.defined() || !value.defined()) {
      return Status::RuntimeError(where() + "an undefined tensor");
    }
    KILN_ASSIGN_OR_RETURN(layouts[i], MetaAt(u.input_slot, symbols,
                                             symbols != nullptr ? &scratch[i] : nullptr));
    const ValueMeta& in = *layouts[i];
    // The value's sizes too: copy_ would broadcast a smaller one without a word.
    const c10::IntArrayRef written(u.restride ? u.new_meta.sizes : in.sizes);
    if (target.scalar_type() != in.dtype || target.sizes() != c10::IntArrayRef(in.sizes) ||
        value.scalar_type() != in.dtype || value.sizes() != written) {
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
      const ValueMeta& own = u.restride ? u.new_meta : *layouts[i];
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
  const std::vector<int64_t> symbols = sizes_.ExampleValues();
  for (int s : input_slots_) {
    const ValueMeta& m = metas_[s];
    const at::TensorOptions options = at::TensorOptions().dtype(m.dtype).device(device_);
    if (!symbolic_[s]) {
      inputs.push_back(EmptyWithLayout(m, options));
    } else {  // contiguous, of the sizes the example values give (Create checked them)
      const auto in = std::find_if(sized_inputs_.begin(), sized_inputs_.end(),
                                   [&](const SizedInput& i) { return input_slots_[i.index] == s; });
      std::vector<int64_t> sizes;
      for (const SizeExpr& e : in->sizes) {
        const StatusOr<int64_t> v = PlanSizes::Evaluate(e, symbols);
        sizes.push_back(v.ok() ? std::max<int64_t>(*v, 0) : 0);
      }
      inputs.push_back(at::empty(sizes, options));
    }
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
