// PlanSpec: a kiln.v1.ExecutionPlan as the runtime reads it, decoded from the artifact's bytes
// (plan_decoder.h) with the fields a plan uses. Plain C++ without torch or protobuf, so the
// decoder builds and is tested and fuzzed on its own; Plan (plan_runtime.h) validates it.
#ifndef KILN_RUNTIME_PLAN_SPEC_H_
#define KILN_RUNTIME_PLAN_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kiln::runtime {

// kiln.v1's enums (proto/kiln/v1/graph.proto), with their wire numbers. The decoder keeps any
// number it reads (proto3 enums are open); Plan refuses the ones it does not know.
enum class WireDType : int32_t {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt8 = 5,
  kInt16 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kUInt8 = 9,
  kBool = 10,
  kComplex64 = 11,
  kComplex128 = 12,
  kUInt64 = 13,
};
enum class WireDeviceKind : int32_t { kUnspecified = 0, kCpu = 1, kCuda = 2 };
enum class WireMemoryFormat : int32_t {
  kUnspecified = 0,
  kContiguous = 1,
  kPreserve = 2,
  kChannelsLast = 3,
  kChannelsLast3d = 4,
};
enum class WireLayout : int32_t { kUnspecified = 0, kStrided = 1 };

// kiln.v1.Device.
struct DeviceSpec {
  WireDeviceKind kind = WireDeviceKind::kUnspecified;
  int32_t index = 0;
};

// kiln.v1.SymTerm: coefficient * the product of the symbols' values.
struct SymTermSpec {
  int64_t coefficient = 0;
  std::vector<uint32_t> symbols;  // SizeSymbolSpec ids, repeated for powers.
};

// kiln.v1.SymExpr: the sum of its terms (0 for none).
struct SymExprSpec {
  std::vector<SymTermSpec> terms;
};

// kiln.v1.SizeSymbol: the value is per-call input `input`'s size along `dim`, in [min, max]
// (max 0: unbounded).
struct SizeSymbolSpec {
  uint32_t id = 0;
  uint32_t input = 0;
  uint32_t dim = 0;
  int64_t min = 0;
  int64_t max = 0;
};

// kiln.v1.TensorMeta without device and requires_grad (a plan runs on one device, for inference).
struct MetaSpec {
  WireDType dtype = WireDType::kUnspecified;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // In elements.
  int64_t storage_offset = 0;    // In elements.
  // Plans with size symbols: one per dim when any size or stride depends on them (sizes and
  // strides then say -1 and 0 there); empty otherwise.
  std::vector<SymExprSpec> size_exprs, stride_exprs;
  // The storage offset's expression where it depends on them (storage_offset 0 then): at most one.
  std::vector<SymExprSpec> storage_offset_expr;
};

// kiln.v1.Value.
struct ValueSpec {
  uint32_t id = 0;
  MetaSpec meta;
};

// kiln.v1.Constant. `data` views the bytes the plan was decoded from.
struct ConstantSpec {
  ValueSpec value;
  std::string_view data;  // Little-endian elements, contiguous.
};

// One argument of a library call (kiln.v1.Argument). Which fields hold the payload:
//   kValue: i (a value id)                kInt: i              kFloat: f       kBool: b
//   kInts: list                           kValues: list (ids)  kNone: nothing  kStr: s
//   kDtype: i (a WireDType)               kDevice: device
//   kMemoryFormat: i (a WireMemoryFormat) kLayout: i (a WireLayout)
//   kSymInt: exprs (one)                  kSymInts: exprs (one per element)
// kUnset: the argument named no kind (Plan refuses it). Plan converts each payload to the type
// of the schema argument it binds to.
struct CallArg {
  enum class Kind {
    kUnset,
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
    kLayout,
    kSymInt,
    kSymInts
  };
  std::string name;  // Schema argument name; empty for a positional argument.
  Kind kind = Kind::kUnset;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::vector<int64_t> list;
  std::string s;
  DeviceSpec device;
  std::vector<SymExprSpec> exprs;
};

// kiln.v1.KernelLaunch plus its step's release list. grid, block and shared_memory_bytes are
// CUDA's launch configuration: empty and 0 for a CPU kernel.
struct KernelStepSpec {
  std::string symbol;
  std::vector<uint32_t> args, writes, release;
  std::vector<uint32_t> grid, block;  // (x, y, z); Plan reads a missing y or z as 1.
  uint32_t shared_memory_bytes = 0;
  // Plans with size symbols: the kernel's integer parameters, and grid[0] per call when
  // has_grid_work (kiln.v1.KernelLaunch.grid_work).
  std::vector<SymExprSpec> size_args;
  bool has_grid_work = false;
  SymExprSpec grid_work;
  uint32_t grid_work_per_block = 0;
  uint32_t grid_max = 0;
};

// kiln.v1.LibraryCall plus its step's release list.
struct LibraryStepSpec {
  std::string op;  // Schema name with overload: "aten::add.Tensor", "aten::relu".
  std::vector<CallArg> args;
  std::vector<uint32_t> outputs, release;
  std::string schema;  // The declared schema the dispatcher's must equal; empty: not checked.
};

// kiln.v1.InputUpdate: after the last step, `input` takes new_meta's layout (when set) and then
// `value`'s elements.
struct InputUpdateSpec {
  uint32_t input = 0;
  uint32_t value = 0;
  bool has_new_meta = false;
  MetaSpec new_meta;
};

// kiln.v1.PlanStep. A step that names neither a kernel nor a library call is refused by the
// decoder.
using StepSpec = std::variant<KernelStepSpec, LibraryStepSpec>;

// kiln.v1.Buffer.
struct BufferSpec {
  uint32_t id = 0;
  bool in_arena = false;
  uint64_t arena_offset = 0;  // Bytes; a multiple of 64 (Plan checks it).
};

// kiln.v1.ExecutionPlan, field for field.
struct PlanSpec {
  std::vector<uint32_t> inputs;  // Bound in order: the plan's parameters first, then per call.
  std::vector<ConstantSpec> constants;
  std::vector<StepSpec> steps;
  std::vector<uint32_t> outputs;  // May repeat an id or name an input.
  std::vector<ValueSpec> values;
  std::vector<BufferSpec> buffers;
  uint64_t arena_bytes = 0;
  // Steps over constants and bound parameters whose results (prologue_outputs) the per-call
  // steps read.
  std::vector<StepSpec> prologue;
  std::vector<uint32_t> prologue_outputs;
  std::vector<InputUpdateSpec> input_updates;  // Applied in order after the last step.
  std::vector<SizeSymbolSpec> size_symbols;    // Bound from the inputs at each call.
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PLAN_SPEC_H_
