// Fusion of a graph with size symbols (Graph.size_symbols): kernels whose sizes are runtime values.
//
// The graph is fused as a static one at representative sizes (each symbol a fixed value in its
// range); then each kernel group is kept only where what the fuser decided holds for every value
// of the symbols, checked on the size expressions: every node of the group is over the group's
// iteration space (or its rows), every operand broadcasts to it, and the dims that depend on
// symbols lead the loop order (the first output's memory order; a row-wise group's kept dims) and
// merge into one extent that every access walks with a static stride (a contiguous or broadcast
// block), every other size and stride static. Such a group becomes a kernel over
// [outer, static dims...] whose outer extent is evaluated per call (FusedGroup::runtime_outer);
// where a group fails, the nodes that made it fail (one that reads an operand no static stride
// walks, say; all of its nodes when none alone did) are library steps, and the graph is fused
// again without them.
#pragma once

#include <memory>
#include <optional>
#include <unordered_set>

#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

struct SymbolicFusion {
  // What the code generators read: the graph at the representative sizes, where each group with a
  // runtime outer extent sees its values (and the inputs its reductions read) with its merged
  // sizes and strides, and its reductions' dims counted from the end.
  std::unique_ptr<kiln::v1::Graph> kernels_graph;
  FusedProgram program;  // over *kernels_graph: its meta points there
};

// Fuses `graph` (validated, with size symbols; `bound` as FuseGraph takes it) for `device`.
// nullopt when the representative sizes overflow (then every node is a library step).
std::optional<SymbolicFusion> FuseSymbolicGraph(const kiln::v1::Graph& graph,
                                                const std::unordered_set<uint32_t>* bound,
                                                kiln::v1::DeviceKind device);

}  // namespace kiln::compiler
