// FusedProgram: a graph split into kernel groups and library steps, in execution order. The
// fuser (passes/fusion.h) makes it; the memory plan and both code generators read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
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
// a depthwise convolution and its pointwise epilogue (convolution >= 0), or (outer_rank >= 0) a
// row-wise group: reductions of the space's trailing dims, the pointwise nodes over the full space
// that feed or follow them, and pointwise nodes over the reduced rows (keepdim shape: the space's
// leading outer_rank sizes, then ones).
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
  // Graphs with size symbols (FuseSymbolicGraph): when set, sizes[0] is this expression's value
  // at each call (sizes[0] holds it at the compile's representative sizes), every other size and
  // every stride static. The kernel takes it as its one size argument (KernelLaunch.size_args).
  std::optional<kiln::v1::SymExpr> runtime_outer;
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

// The symbol a code generator exports for group `index` and the plan's KernelLaunch names.
std::string KernelSymbol(int index);

// sizes[0] where it is the call's (runtime_outer set); 0 for a static group.
inline int64_t RuntimeOuter(const FusedGroup& g) { return g.runtime_outer ? g.sizes[0] : 0; }

// The shape of a row value of a row-wise group: sizes[:outer_rank] then ones.
std::vector<int64_t> RowShape(const FusedGroup& group);

}  // namespace kiln::compiler
