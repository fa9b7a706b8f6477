// Which values depend only on bound inputs and constants, and the node order that puts them
// first.
#include "compiler/passes/bound_prologue.h"

#include "compiler/ir/sym_expr.h"

#include "compiler/ir/graph_index.h"
#include "compiler/ir/op_classes.h"

namespace kiln::compiler {

using kiln::v1::Graph;
using kiln::v1::Node;

std::unordered_set<uint32_t> BoundValues(const Graph& graph) {
  std::unordered_set<uint32_t> bound;
  const int n = std::min<int>(static_cast<int>(graph.num_bound_inputs()), graph.inputs_size());
  for (int i = 0; i < n; ++i) bound.insert(graph.inputs(i).id());
  for (const auto& c : graph.constants()) bound.insert(c.value().id());
  const std::unordered_set<uint32_t> escaping = Escaping(graph);
  const NondeterministicOps random(graph);
  for (const Node& node : graph.nodes()) {
    if (random.Contains(node.op()) || node.outputs_size() == 0) continue;
    bool only_bound = true;
    for (uint32_t id : ValuesRead(node)) only_bound = only_bound && bound.count(id);
    for (const auto& out : node.outputs()) {
      only_bound = only_bound && !escaping.count(out.id()) && !IsSymbolic(out.meta());
    }
    // A size argument over the graph's symbols (arange(s0)) is the call's, not a parameter's.
    for (const auto& arg : node.args()) {
      only_bound = only_bound && arg.kind_case() != kiln::v1::Argument::kSymIntValue &&
                   arg.kind_case() != kiln::v1::Argument::kSymIntList;
    }
    if (!only_bound) continue;
    for (const auto& out : node.outputs()) bound.insert(out.id());
  }
  return bound;
}

bool IsBoundNode(const Node& node, const std::unordered_set<uint32_t>& bound) {
  if (node.outputs_size() == 0) return false;
  for (const auto& out : node.outputs()) {
    if (!bound.count(out.id())) return false;
  }
  return true;
}

Graph BoundNodesFirst(const Graph& graph, const std::unordered_set<uint32_t>& bound) {
  Graph out = EmptyLike(graph);
  for (const Node& node : graph.nodes()) {
    if (IsBoundNode(node, bound)) *out.add_nodes() = node;
  }
  for (const Node& node : graph.nodes()) {
    if (!IsBoundNode(node, bound)) *out.add_nodes() = node;
  }
  return out;
}

}  // namespace kiln::compiler
