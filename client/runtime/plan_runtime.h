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
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/kernel_library.h"

namespace kiln::runtime {

// What the plan says about a value (kiln.v1.TensorMeta without device and requires_grad): a
// kernel is compiled for exactly this dtype, these sizes and strides.
struct ValueMeta {
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // In elements; as many as sizes.
  int64_t storage_offset = 0;    // In elements.
};

// One argument of a library call (kiln.v1.Argument). Which fields hold the payload:
//   kValue: i (a value id)               kInt: i             kFloat: f        kBool: b
//   kInts: list                          kValues: list (ids) kNone: nothing   kStr: s
//   kDtype: i (c10::ScalarType)          kDevice: s ("cpu", "cuda:0")
//   kMemoryFormat: i (c10::MemoryFormat) kLayout: i (c10::Layout)
// The plan converts each to the type of the schema argument it binds to (see Plan).
struct CallArg {
  enum class Kind {
    kValue,
    kInt,
    kFloat,
    kBool,
    kInts,
    kValues,
    kDtype,
    kNone,
    kStr,
    kDevice,
    kMemoryFormat,
    kLayout
  };
  std::string name;  // Schema argument name; empty for a positional argument.
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::vector<int64_t> list;
  std::string s;
};

// kiln.v1.KernelLaunch (CPU) plus its step's release list.
struct KernelStepSpec {
  std::string symbol;
  std::vector<uint32_t> args, writes, release;
};

// kiln.v1.LibraryCall plus its step's release list.
struct LibraryStepSpec {
  std::string op;  // Schema name with overload: "aten::add.Tensor", "aten::relu".
  std::vector<CallArg> args;
  std::vector<uint32_t> outputs, release;
};

// kiln.v1.Buffer.
struct BufferSpec {
  uint32_t id = 0;
  bool in_arena = false;
  uint64_t arena_offset = 0;  // Bytes; a multiple of 64.
};

// Everything a plan is built from: kiln.v1.ExecutionPlan with the kernel binary, constants
// already made into tensors (the Python side builds them from the artifact's bytes, or passes
// the module's parameters as constants bound once).
struct PlanSpec {
  std::string kernel_binary;  // ELF shared object; empty when no step launches a kernel.
  std::vector<std::pair<uint32_t, ValueMeta>> values;
  std::vector<uint32_t> inputs;                            // Bound per call, in order.
  std::vector<std::pair<uint32_t, at::Tensor>> constants;  // Bound once, at construction.
  std::vector<BufferSpec> buffers;
  uint64_t arena_bytes = 0;
  std::vector<std::variant<KernelStepSpec, LibraryStepSpec>> steps;
  // kiln.v1.ExecutionPlan.prologue and prologue_outputs: steps over constants (the bound
  // parameters among them) whose results the per-call steps read.
  std::vector<std::variant<KernelStepSpec, LibraryStepSpec>> prologue;
  std::vector<uint32_t> prologue_outputs;
  std::vector<uint32_t> outputs;  // May repeat an id or name an input.
  c10::Device device = c10::Device(c10::kCPU);
};

// Building checks the whole plan once so that a call does no lookups and no validation beyond
// what its inputs can change:
//  - Every id the plan names has metadata in `values`; each value is defined once (input,
//    constant, buffer or library output) and used only after its definition and before its
//    release; a release never names a plan output or an arena buffer; a kernel writes only
//    buffers, and nothing reads a buffer before a kernel has written it.
//  - Arena buffers fit in arena_bytes at an offset that is a multiple of 64, are not plan
//    outputs, and are never read by an op whose result may alias an argument (a view would
//    outlive the arena slot's lifetime).
//  - Constants match their metadata's dtype and sizes; they are moved to the plan's device and
//    copied once into the metadata's strides, so kernels take them without a per-call copy.
//  - Every kernel symbol resolves in kernel_binary (CPU plans only).
//  - Every library op resolves in the dispatcher ("aten::add.Tensor": name "aten::add",
//    overload "Tensor"), and its arguments bind to the schema: positional arguments in schema
//    order (they may fill keyword-only slots), then named ones by name, schema defaults for the
//    rest. Each payload is converted to the argument's type: an int to an int, a float, a
//    Scalar (int Scalar), an int[N] (repeated N times, as Python does) or a wrapped-number
//    tensor; a float to a float or a double Scalar; "ints" to int[] / SymInt[] / float[] /
//    bool[]; "values" to Tensor[] or Tensor?[]; "none" only to an optional; dtype, layout and
//    memory_format to those enums. An unknown name, a duplicate, a missing required argument or
//    a payload that does not fit fails the build. Every return must be a Tensor, Tensor? or
//    Tensor[]; without Tensor[] returns their count must equal the call's outputs.
//  - Prologue steps read only constants and earlier prologue results (the per-call inputs are
//    not defined yet), put no buffer in the arena, and define every prologue output, none of
//    which is a plan output.
// Build failures throw std::invalid_argument naming the step ("step 3 (aten::mm): ...").
//
// The prologue runs on the first call, and again on a call that finds a constant it read (a
// bound parameter) with another version counter or data pointer than when it last ran: an
// in-place update, load_state_dict or `.data =` between calls is seen. (A write through a
// `.data` alias bumps no version counter and is not.) Its outputs are shared by all calls.
//
// Run is const and keeps its per-call state (value slots, arena) on its own stack, so one plan
// may run on several threads at once. It does not touch autograd mode: kernels write through
// raw pointers, so a plan is for inference, and the caller chooses the grad mode.
class Plan {
 public:
  explicit Plan(PlanSpec spec);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Runs the plan on `inputs` (one per PlanSpec::inputs, in order) and returns the outputs.
  // A kernel argument that is not a buffer must have its metadata's dtype and sizes and live on
  // the plan's device; with other strides or storage offset it is first copied into exactly the
  // metadata's layout. Throws std::runtime_error naming the step index and its op or symbol
  // ("step 2 (kernel k0): ...") on any failure; the inputs are never modified.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs) const;

  int num_kernels() const { return num_kernels_; }
  int num_library_calls() const { return num_library_calls_; }
  size_t num_inputs() const { return input_slots_.size(); }
  size_t num_outputs() const { return output_slots_.size(); }
  uint64_t arena_bytes() const { return arena_bytes_; }

 private:
  struct KernelStep {
    KernelFn fn;         // No initializer: it would make Step's variant not default-constructible.
    std::string symbol;  // For profilers: "kiln_kernel_3".
    std::vector<int> slots;     // Argument slots, in parameter order.
    std::vector<char> checked;  // Per argument: not a buffer, so its layout may differ.
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

  int Slot(uint32_t id) const;
  void RunSteps(const std::vector<Step>& steps, std::vector<at::Tensor>& vals,
                const at::Tensor& arena) const;
  Stamps StampWatched() const;
  // The prologue's outputs, after running it if a watched constant changed since it last ran.
  std::shared_ptr<const std::vector<at::Tensor>> PrologueValues() const;
  LibraryStep BindLibrary(const LibraryStepSpec& spec, const std::string& where) const;
  at::Tensor AllocateBuffer(int slot, const at::Tensor& arena) const;
  void RunKernel(const KernelStep& k, std::vector<at::Tensor>& vals) const;
  void RunLibrary(const LibraryStep& l, std::vector<at::Tensor>& vals) const;

  std::unique_ptr<KernelLibrary> library_;  // Null when the plan launches no kernel.
  std::vector<uint32_t> ids_;               // Slot -> value id, sorted.
  std::vector<ValueMeta> metas_;            // Slot -> metadata.
  std::vector<at::Tensor> bound_;           // Slot -> constant (undefined for other values).
  std::vector<at::Tensor> originals_;       // Slot -> the constant as given (before any copy).
  std::vector<Buffer> buffers_;             // Slot -> buffer placement (for buffer slots).
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<Step> steps_;
  std::vector<Step> prologue_;
  std::vector<int> prologue_output_slots_;
  std::vector<int> watched_;  // Constant slots the prologue reads.
  mutable std::mutex prologue_mutex_;
  mutable std::shared_ptr<const std::vector<at::Tensor>> prologue_values_;  // Under the mutex.
  mutable Stamps prologue_stamps_;                                          // Under the mutex.
  uint64_t arena_bytes_ = 0;
  c10::Device device_;
  int num_kernels_ = 0;
  int num_library_calls_ = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PLAN_RUNTIME_H_
