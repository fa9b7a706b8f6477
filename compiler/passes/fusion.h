// Fusion into kernel groups, for one device kind (CPU or CUDA): pointwise nodes with one iteration
// space become one kernel group (chains that depend on each other and independent ones alike),
// views feeding a group are folded into its operands' strides, everything else is a library step;
// steps nobody reads are dropped. The result is in execution order.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// Plans `graph` (validated). Never fails: what cannot be fused is a library step. Kernels over
// the same iteration space are merged when no other step lies on a path between them and the
// values they store share a layout (horizontal fusion); the steps the later one needs then run
// before the merged kernel, random ops keeping their order. With `bound` (BoundValues, the graph
// ordered by BoundNodesFirst), nodes defining bound values (the plan's prologue, run once per
// parameter version) are library steps, never in a kernel. Only nodes whose tensors all live on a
// device of kind `device` (the target's) are fused; the rest are library steps.
// Nodes whose indices are in `library_nodes` (when given) are library steps too.
FusedProgram FuseGraph(const kiln::v1::Graph& graph,
                       const std::unordered_set<uint32_t>* bound = nullptr,
                       kiln::v1::DeviceKind device = kiln::v1::DEVICE_KIND_CPU,
                       const std::unordered_set<int>* library_nodes = nullptr);

// True when `node`'s single result addresses its first input's storage with the result's own
// strides and storage offset, so a kernel may read the input in its place (FuseGraph folds it).
// For reshape-like ops (MayAliasInput, not IsAlwaysView) this holds for the static sizes of
// `meta` only: both the input and the result are row-major there.
bool FoldableView(const kiln::v1::Node& node,
                  const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta);

// True when `node` can be computed inside a generated kernel (a pointwise op of the table over
// dtypes the generator handles, whose operands broadcast to its output, all on one device of kind
// `device`).
bool IsFusable(const kiln::v1::Node& node,
               const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
               kiln::v1::DeviceKind device = kiln::v1::DEVICE_KIND_CPU);

}  // namespace kiln::compiler
