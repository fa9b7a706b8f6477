// Plan: a verified artifact's ExecutionPlan made ready to run (kernels resolved, library calls
// bound to their ATen schemas, value ids mapped to dense slots) and its per-call execution in C++.
#ifndef KILN_RUNTIME_PLAN_RUNTIME_H_
#define KILN_RUNTIME_PLAN_RUNTIME_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/cuda_module.h"
#include "runtime/kernel_library.h"
#include "runtime/plan_sizes.h"
#include "runtime/plan_spec.h"
#include "runtime/value_layout.h"
#include "status.h"

namespace kiln::runtime {


// What a plan is bound to when it is built, besides its PlanSpec.
struct PlanBinding {
  // The artifact's kernels, read only while the plan is built; empty when no step launches a
  // kernel. A CPU plan's is an ELF shared object, a CUDA plan's a cubin for the GPU's exact
  // architecture (BINARY_FORMAT_CUBIN).
  std::string_view kernel_binary;
  // A CUDA plan's PTX of the same kernels (ArtifactBody.kernel_ptx), loaded where the cubin does
  // not load on the plan's GPU; may be empty.
  std::string_view kernel_ptx;
  // Bound once to the plan's first inputs (a module's parameters and buffers, see
  // kiln.v1.Graph.num_bound_inputs); a call passes the rest.
  std::vector<at::Tensor> params;
  // The plan's device: "cpu", or a CUDA device with its index ("cuda:0").
  c10::Device device = c10::Device(c10::kCPU);
};

// Create checks the whole plan once (the one validation of a plan on the client) so that a call
// does no lookups and no validation beyond what its inputs can change:
//  - Every id the plan names has metadata in `values`, with a dtype torch has, sizes, strides
//    and storage offset >= 0, and an extent whose bytes int64_t counts; each value is defined
//    once (input, parameter, constant, buffer or library output) and used only after its
//    definition and before its release; a release never names a plan output or an arena buffer;
//    a kernel writes only buffers, and nothing reads a buffer before a kernel has written it.
//  - Arena buffers fit in arena_bytes at an offset that is a multiple of 64 (on a GPU too: the
//    caching allocator's blocks are 512-byte aligned, so every buffer is aligned for the 16-byte
//    vector loads CUDA kernels make), are not plan outputs, and are never read by an op whose
//    result may alias an argument (a view would outlive the arena slot's lifetime).
//  - Constants hold exactly their metadata's bytes. Constants and parameters match their value's
//    dtype and sizes; they are moved to the plan's device and copied once into the metadata's
//    strides, so kernels take them without a per-call copy.
//  - Every kernel symbol resolves in kernel_binary. A CPU plan dlopens it (KernelLibrary); a
//    CUDA plan names its device's index and loads it, or kernel_ptx, into the device's primary
//    context through the driver (CudaModule), and each kernel's grid and block have one to three
//    dimensions (a missing one is 1), none 0, at most 1024 threads a block. A driver that is
//    absent or refuses both images fails the build (kInvalidArgument).
//  - Every library op resolves in the dispatcher ("aten::add.Tensor": name "aten::add",
//    overload "Tensor"), and its arguments bind to the schema: positional arguments in schema
//    order (they may fill keyword-only slots), then named ones by name, schema defaults for the
//    rest. Each payload is converted to the argument's type: an int to an int, a float, a
//    Scalar (int Scalar), an int[N] (repeated N times, as Python does) or a wrapped-number
//    tensor; a float to a float or a double Scalar; "ints" to int[] / SymInt[] / float[] /
//    bool[]; "values" to Tensor[] or Tensor?[]; "none" only to an optional; dtype, layout,
//    memory_format and device (kiln.v1's numbering) to c10's. An unknown name, a duplicate, a
//    missing required argument or a payload that does not fit fails the build. Every return must be
//    a Tensor, Tensor? or Tensor[]; without Tensor[] returns their count must equal the call's
//    outputs.
//  - Prologue steps read only constants and earlier prologue results (the per-call inputs are
//    not defined yet), put no buffer in the arena, and define every prologue output, none of
//    which is a plan output.
// Build failures are kInvalidArgument naming the step ("kiln plan: step 3 (aten::mm): ...");
// torch failing while constants are bound (out of memory) is kRuntimeError.
//
// The prologue runs on the first call, and again on a call that finds a constant it read (a
// bound parameter) with another version counter or data pointer than when it last ran: an
// in-place update, load_state_dict or `.data =` between calls is seen. (A write through a
// `.data` alias bumps no version counter and is not.) Its outputs are shared by all calls.
//
// Input updates (the graph's in-place updates of its inputs): each names an input (a per-call
// one, or a parameter bound to the plan's own tensor, not a copy of it: Create refuses a plan
// that would update a parameter it reads through a copy) and a value of its dtype and sizes
// (new_meta's, when the update changes the input's layout). After the last step, Run checks
// every update (the tensor is defined, has its metadata's dtype and sizes, and its storage holds
// the new layout), copies a value that shares memory with an updated input first, then, in
// order, gives each input its new layout (as_strided_) and the value's elements (copy_): the
// caller's own tensors change as eager's in-place ops changed them. A failed check writes
// nothing.
//
// Run is const and keeps its per-call state (value slots, arena) on its own stack, so one plan
// may run on several threads at once. It does not touch autograd mode: kernels write through
// raw pointers, so a plan is for inference, and the caller chooses the grad mode.
//
// On a CUDA device a run makes the plan's device current for its duration and enqueues all its
// work (kernels through cuLaunchKernel, library calls through ATen) on the caller's current
// stream of that device; buffers and the arena come from torch's caching allocator, so tensors
// released or returned are ordered with that stream as torch's own are. Run returns once the
// work is enqueued; no step synchronises with the host.
class Plan {
 public:
  static StatusOr<std::unique_ptr<Plan>> Create(const PlanSpec& spec, PlanBinding binding);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Runs the plan on `inputs` (one per PlanSpec::inputs after the bound parameters, in order)
  // and sets *outputs. A kernel argument that is not a buffer must have its metadata's dtype and
  // sizes and live on the plan's device; with other strides or storage offset it is first copied
  // into exactly the metadata's layout. Any failure is kRuntimeError naming the step index and
  // its op or symbol ("kiln plan: step 2 (kernel k0): ..."); the inputs are modified only by the
  // plan's input updates, after every step succeeded. An undefined input (None) is read as an
  // undefined tensor (what a Tensor? argument takes).
  Status Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs) const;

  // The prologue's outputs (one per PlanSpec::prologue_outputs), after running the prologue if it
  // has not run or a bound tensor it reads changed since (see above); the same object until then.
  StatusOr<std::shared_ptr<const std::vector<at::Tensor>>> PrologueValues() const;

  // Run with `prologue_values` (shaped as PrologueValues' result) in place of the plan's own: the
  // per-call steps read exactly these tensors. For a caller that keeps its own copy at fixed
  // addresses (a CUDA graph).
  Status RunWithPrologue(const std::vector<at::Tensor>& prologue_values,
                         const std::vector<at::Tensor>& inputs,
                         std::vector<at::Tensor>* outputs) const;

  // What an output is, so that a caller that returns copies of outputs (a CUDA graph) can give
  // back the caller's own input, or the bound tensor, where the plan does.
  struct OutputSource {
    enum Kind { kComputed, kInput, kBound } kind;
    size_t index;  // kInput: the input's position in Run's `inputs`.
  };
  std::vector<OutputSource> OutputSources() const;
  // The tensors bound at creation (constants, parameters) as the steps read them, in no order:
  // a caller that captures the plan's reads by address watches their data pointers.
  std::vector<at::Tensor> BoundTensors() const;
  const c10::Device& device() const { return device_; }
  // Zeroed tensors with each per-call input's metadata, on the plan's device: a run over them
  // does what a first run sets up (the prologue, oneDNN's primitives, a CUDA graph) ahead of
  // the first real call.
  std::vector<at::Tensor> ExampleInputs() const;

  // Whether the plan has size symbols (kiln.v1.ExecutionPlan.size_symbols): one plan for every
  // size in their ranges, read from each call's inputs. Its kernels take their outer extent per
  // call (KernelStep::size_args, the CUDA grid per call) and its symbolic buffers are allocated
  // at the call's sizes; no CUDA graph replays it.
  bool symbolic() const { return !sizes_.empty(); }
  int num_kernels() const { return num_kernels_; }
  int num_library_calls() const { return num_library_calls_; }
  size_t num_inputs() const { return input_slots_.size(); }
  size_t num_outputs() const { return output_slots_.size(); }
  size_t num_prologue_outputs() const { return prologue_output_slots_.size(); }
  // How many times the prologue has run: once for the first call, again after a bound tensor
  // it reads changed.
  int prologue_runs() const;
  // Prologue steps run on the host (a CUDA plan's small ones: see RunLibraryOnHost), over all
  // runs.
  int host_prologue_steps() const;
  uint64_t arena_bytes() const { return arena_bytes_; }

  // The label of the first per-call library step that calls one of `ops` ("aten::nonzero"), or
  // "" when none does.
  std::string FirstCallOf(const std::vector<std::string>& ops) const;

  // The label of the first step (prologue or per call) whose op draws random numbers (torch's
  // nondeterministic_seeded tag, unless its dropout_p is a constant 0), or "". A run of such a plan moves the generator as eager's
  // does: one made ahead of the program's calls (a warm-up, a CUDA graph's capture) would shift
  // the numbers its calls draw.
  const std::string& first_random_step() const { return first_random_step_; }

  // An in-place update of an input, as Run applies it (see above).
  struct InputUpdate {
    int input_slot = 0;
    int value_slot = 0;
    int call_index = -1;  // The input's position in Run's `inputs`; -1 for a bound parameter.
    bool restride = false;
    ValueMeta new_meta;  // The input's layout afterwards, when restride.
  };
  const std::vector<InputUpdate>& input_updates() const { return input_updates_; }

 private:
  struct KernelStep {
    kiln_kernel_fn fn;   // No initializer: it would make Step's variant not default-constructible.
    CudaKernel cuda;     // A CUDA plan's launch (fn is then null).
    std::string symbol;  // For profilers: "kiln_kernel_3".
    std::vector<int> slots;     // Argument slots, in parameter order.
    std::vector<char> checked;  // Per argument: not a buffer, so its layout may differ.
    // A symbolic plan's kernel: integers after the pointers (the runtime outer extent), and
    // grid[0] per call, ceil(grid_work / grid_work_per_block) within [1, grid_max]. (No
    // initializers, as for fn; KernelStep{} zeroes them.)
    std::vector<SizeExpr> size_args;
    std::optional<SizeExpr> grid_work;
    uint32_t grid_work_per_block;
    uint32_t grid_max;
  };
  struct LibraryStep {
    c10::OperatorHandle op;
    std::vector<c10::IValue> stack;                   // Every non-tensor argument bound.
    std::vector<std::pair<size_t, int>> tensor_args;  // Stack position -> slot.
    struct ListArg {
      size_t position;
      std::vector<int> slots;
      bool optional_elements;  // Tensor?[] rather than Tensor[].
    };
    std::vector<ListArg> list_args;
    std::vector<int> outputs;
    // Results are new tensors (no return aliases an argument) of a CUDA plan: one whose layout
    // is not its metadata's is copied into it (see RunLibrary).
    bool relayout = false;
    // No result is a list or aliases an argument: one whose dtype is not its metadata's is cast.
    bool fresh_results = false;
    // The schema returns numbers beside its tensors, which bind to no slot.
    bool skips_numbers = false;
    // SymInt and SymInt[] arguments (a view's sizes): evaluated per call into the stack.
    struct SizeArg {
      size_t position;
      std::vector<SizeExpr> exprs;  // One for a SymInt.
      bool list;
      bool tensor;  // A SymInt where the schema takes a Tensor: passed as a wrapped number.
    };
    std::vector<SizeArg> size_args = {};
    // A view op (IsPlainView) whose result is no plan output: its input's slot. The result is
    // then made from the plan's metadata without the dispatcher where it can be (MadeView).
    int view_of = -1;
    bool reshapes = false;  // aten::view or _unsafe_view: the result's strides are checked
  };
  struct Step {
    std::string label;  // "step 3 (aten::mm)", for errors.
    std::variant<KernelStep, LibraryStep> body;
    std::vector<int> allocate;  // Buffer slots first named by this step.
    std::vector<int> release;
  };
  struct Buffer {
    bool in_arena = false;
    int64_t arena_element_offset = 0;  // Storage offset, in elements, of its view of the arena.
  };

  using Stamps = std::vector<std::pair<int64_t, const void*>>;  // (version, data) per watched

  class Builder;  // Create's checks and bindings, in plan_builder.cpp.

  Plan(c10::Device device, uint64_t arena_bytes);
  // `host`: a CUDA plan's prologue, whose small steps run on the host (RunLibraryOnHost), the
  // host copies of its values; null elsewhere. `symbols`: the call's size symbols (a symbolic
  // plan's per-call steps).
  Status RunSteps(const std::vector<Step>& steps, std::vector<at::Tensor>& vals,
                  const at::Tensor& arena, std::vector<at::Tensor>* host = nullptr,
                  const std::vector<int64_t>* symbols = nullptr) const;
  // The size symbols' values for a call, its inputs checked against the sizes they imply.
  StatusOr<std::vector<int64_t>> BindSizes(const std::vector<at::Tensor>& inputs) const;
  Stamps StampWatched() const;
  Status RunMain(const std::vector<at::Tensor>* prologue_values,
                 const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs) const;
  Status ApplyInputUpdates(const std::vector<at::Tensor>& vals,
                           const std::vector<at::Tensor>& inputs,
                           const std::vector<int64_t>* symbols) const;
  at::Tensor AllocateBuffer(int slot, const at::Tensor& arena,
                            const std::vector<int64_t>* symbols) const;
  // The metadata of slot `s` at the call's symbol values: metas_[s] itself for a static slot (no
  // copy on the per-call path), else evaluated into `*scratch`.
  StatusOr<const ValueMeta*> MetaAt(int s, const std::vector<int64_t>* symbols,
                                    ValueMeta* scratch) const;
  Status RunKernel(const KernelStep& k, std::vector<at::Tensor>& vals,
                   const std::vector<int64_t>* symbols) const;
  Status LaunchCuda(const KernelStep& k, void* const* pointers, size_t n,
                    const std::vector<int64_t>* symbols) const;
  Status RunLibrary(const LibraryStep& l, std::vector<at::Tensor>& vals,
                    const std::vector<int64_t>* symbols = nullptr) const;
  // The result of view step `l` made as the op would make it: the input's storage with the
  // result's metadata (at the call's sizes), its storage offset moved as the trace moved it,
  // sharing the input's version counter. An undefined tensor where the dispatcher must run the
  // op: autograd records the view, or the input is not laid out as its metadata says.
  at::Tensor MadeView(const LibraryStep& l, const std::vector<at::Tensor>& vals,
                      const std::vector<int64_t>* symbols) const;
  bool SmallEnoughForHost(const LibraryStep& l, const std::vector<at::Tensor>& vals) const;
  Status RunLibraryOnHost(const LibraryStep& l, std::vector<at::Tensor>& vals,
                          std::vector<at::Tensor>& host) const;

  std::unique_ptr<KernelLibrary> library_;   // Null unless a CPU plan launches kernels.
  std::unique_ptr<CudaModule> cuda_module_;  // Null unless a CUDA plan launches kernels.
  std::vector<uint32_t> ids_;                // Slot -> value id, sorted.
  std::vector<ValueMeta> metas_;             // Slot -> metadata.
  // Slot -> whether its metadata depends on the size symbols (metas_ then holds zeros there:
  // its layout is evaluated per call from layouts_, MetaAt).
  std::vector<char> symbolic_;
  // Slot -> a symbolic value's size and stride expressions (empty for a static slot): the
  // layout of its buffer, or of what a kernel reads, per call.
  struct SymbolicLayout {
    std::vector<SizeExpr> sizes, strides;
    std::optional<SizeExpr> offset;  // Where the storage offset depends on the symbols.
  };
  std::vector<SymbolicLayout> layouts_;
  PlanSizes sizes_;  // The size symbols; empty for a static plan.
  // Per-call inputs whose sizes depend on the symbols: position in Run's inputs, their sizes.
  struct SizedInput {
    size_t index;
    std::vector<SizeExpr> sizes;
  };
  std::vector<SizedInput> sized_inputs_;
  std::vector<at::Tensor> bound_;            // Slot -> constant (undefined for other values).
  std::vector<at::Tensor> originals_;        // Slot -> the constant as given (before any copy).
  std::vector<Buffer> buffers_;              // Slot -> buffer placement (for buffer slots).
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<Step> steps_;
  std::vector<Step> prologue_;
  std::vector<int> prologue_output_slots_;
  std::vector<int> watched_;  // Constant slots the prologue reads.
  std::vector<InputUpdate> input_updates_;
  std::string first_random_step_;
  mutable std::mutex prologue_mutex_;
  mutable int prologue_runs_ = 0;        // Under prologue_mutex_.
  mutable int host_prologue_steps_ = 0;  // Under prologue_mutex_.
  mutable std::shared_ptr<const std::vector<at::Tensor>> prologue_values_;  // Under the mutex.
  mutable Stamps prologue_stamps_;                                          // Under the mutex.
  uint64_t arena_bytes_ = 0;
  c10::Device device_;
  int num_kernels_ = 0;
  int num_library_calls_ = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PLAN_RUNTIME_H_
