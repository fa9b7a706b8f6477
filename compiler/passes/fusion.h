// Fusion into kernel groups, for one device kind (CPU or CUDA): pointwise nodes with one iteration
// space become one kernel group (chains that depend on each other and independent ones alike),
// views feeding a group are folded into its operands' strides, everything else is a library step;
// steps nobody reads are dropped. The result is in execution order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// A tensor a kernel reads: the value it indexes (`base`), at an element offset from the base's
// first element, with strides over the kernel's iteration space (0 where broadcast).
struct KernelOperand {
  uint32_t base = 0;
  int64_t offset = 0;
  std::vector<int64_t> strides;
  // Set when the base is a one-element constant: the kernel uses this C++ expression (in the
  // base's compute type) and does not take the base as an argument.
  std::optional<std::string> literal;
};

// A kernel: pointwise nodes over one iteration space (one chain or several independent ones),
// a depthwise convolution and its pointwise epilogue (convolution >= 0), or (outer_rank >= 0) a row-wise group: reductions of the space's trailing dims, the pointwise
// nodes over the full space that feed or follow them, and pointwise nodes over the reduced rows
// (keepdim shape: the space's leading outer_rank sizes, then ones).
struct FusedGroup {
  std::vector<int> nodes;             // indices into Graph.nodes, each after those it reads
  std::vector<int64_t> sizes;         // the iteration space (full nodes' output sizes)
  std::vector<uint32_t> input_ids;    // distinct values read from outside the group
  std::vector<KernelOperand> inputs;  // one per input_ids entry, views folded
  std::vector<uint32_t> outputs;      // values materialized (read later or returned)
  int outer_rank = -1;                // row-wise groups: the dims kept by the reductions
  // CUDA only: the index into Graph.nodes of a depthwise convolution (MatchDepthwiseConvolution)
  // the kernel computes per element before its other nodes, its epilogue; the space is its
  // output's sizes. Such a group never becomes row-wise and never merges with another.
  int convolution = -1;
};

struct FusedStep {
  bool is_kernel = false;
  int node = -1;   // library step: index into Graph.nodes
  int group = -1;  // kernel step: index into FusedProgram.groups
};

struct FusedProgram {
  std::vector<FusedGroup> groups;  // in the order of the steps launching them
  std::vector<FusedStep> steps;
  std::unordered_map<uint32_t, const kiln::v1::TensorMeta*> meta;  // every value of the graph
};

// Plans `graph` (validated). Never fails: what cannot be fused is a library step. Kernels over
// the same iteration space are merged when no other step lies on a path between them and the
// values they store share a layout (horizontal fusion); the steps the later one needs then run
// before the merged kernel, random ops keeping their order. With `bound` (BoundValues, the graph
// ordered by BoundNodesFirst), nodes defining bound values (the plan's prologue, run once per
// parameter version) are library steps, never in a kernel. Only nodes whose tensors all live on a device
// of kind `device` (the target's) are fused; the rest are library steps.
FusedProgram FuseGraph(const kiln::v1::Graph& graph,
                       const std::unordered_set<uint32_t>* bound = nullptr,
                       kiln::v1::DeviceKind device = kiln::v1::DEVICE_KIND_CPU);

// The symbol a code generator exports for group `index` and the plan's KernelLaunch names.
std::string KernelSymbol(int index);

// The shape of a row value of a row-wise group: sizes[:outer_rank] then ones.
std::vector<int64_t> RowShape(const FusedGroup& group);

// True when `node` can be computed inside a generated kernel (a pointwise op of the table over
// dtypes the generator handles, whose operands broadcast to its output, all on one device of kind
// `device`).
bool IsFusable(const kiln::v1::Node& node,
               const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
               kiln::v1::DeviceKind device = kiln::v1::DEVICE_KIND_CPU);

}  // namespace kiln::compiler
