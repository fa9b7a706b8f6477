// The values a graph computes from its bound inputs (a module's parameters and buffers, see
// kiln.v1.Graph.num_bound_inputs) and constants alone: the plan's prologue computes them once
// and again only when a bound input changes, instead of on every call.
#pragma once

#include <cstdint>
#include <unordered_set>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// The bound inputs, the constants, and the outputs of every deterministic node that reads only
// such values and whose result no graph output may alias (a cached tensor is shared by every
// call; an output must be the caller's own), and whose sizes and arguments do not depend on the
// graph's size symbols (those are each call's).
std::unordered_set<uint32_t> BoundValues(const kiln::v1::Graph& graph);

// True when every output of `node` is in `bound`.
bool IsBoundNode(const kiln::v1::Node& node, const std::unordered_set<uint32_t>& bound);

// `graph` with the nodes that define bound values first, each group keeping its order: still
// topological (bound nodes read only bound values), and fusion then never finds a bound node
// between two per-call nodes it would otherwise join.
kiln::v1::Graph BoundNodesFirst(const kiln::v1::Graph& graph,
                                const std::unordered_set<uint32_t>& bound);

}  // namespace kiln::compiler
