// Lookups over a graph's values shared by the graph passes.
#include "compiler/ir/graph_index.h"

#include <algorithm>

#include "compiler/ir/op_classes.h"

namespace kiln::compiler {

using kiln::v1::Argument;
using kiln::v1::Graph;
using kiln::v1::Node;

ValueIndex IndexValues(const Graph& graph) {
  ValueIndex index;
  auto see = [&](const kiln::v1::Value& v) {
    index.meta[v.id()] = &v.meta();
    index.next_id = std::max(index.next_id, v.id() + 1);
  };
  for (const auto& v : graph.inputs()) see(v);
  for (const auto& c : graph.constants()) see(c.value());
  for (int i = 0; i < graph.nodes_size(); ++i) {
    for (const auto& v : graph.nodes(i).outputs()) {
      see(v);
      index.producer[v.id()] = i;
    }
  }
  return index;
}

Graph EmptyLike(const Graph& graph) {
  Graph out;
  *out.mutable_inputs() = graph.inputs();
  out.set_num_bound_inputs(graph.num_bound_inputs());
  *out.mutable_constants() = graph.constants();
  *out.mutable_outputs() = graph.outputs();
  *out.mutable_schemas() = graph.schemas();
  *out.mutable_input_updates() = graph.input_updates();
  *out.mutable_size_symbols() = graph.size_symbols();
  return out;
}

std::unordered_set<uint32_t> GraphOutputs(const Graph& graph) {
  return {graph.outputs().begin(), graph.outputs().end()};
}

std::unordered_set<uint32_t> Escaping(const Graph& graph) {
  std::unordered_set<uint32_t> escaping = GraphOutputs(graph);
  for (int i = graph.nodes_size() - 1; i >= 0; --i) {
    const Node& node = graph.nodes(i);
    if (!(MayAliasInput(node.op()) || WritesFirstInput(node.op())) || node.args_size() == 0 ||
        node.args(0).kind_case() != Argument::kValue) {
      continue;
    }
    for (const auto& out : node.outputs()) {
      if (escaping.count(out.id())) escaping.insert(node.args(0).value());
    }
  }
  return escaping;
}

std::unordered_map<uint32_t, std::vector<int>> Readers(const Graph& graph) {
  std::unordered_map<uint32_t, std::vector<int>> readers;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    for (uint32_t id : ValuesRead(graph.nodes(i))) readers[id].push_back(i);
  }
  return readers;
}

SoleReaders::SoleReaders(const Graph& graph)
    : readers_(Readers(graph)), escaping_(Escaping(graph)) {}

int SoleReaders::Of(uint32_t id) const {
  if (escaping_.count(id)) return -1;
  auto r = readers_.find(id);
  return r == readers_.end() || r->second.size() != 1 ? -1 : r->second[0];
}

std::vector<int64_t> Sizes(const kiln::v1::TensorMeta& m) {
  return {m.sizes().begin(), m.sizes().end()};
}

std::vector<int64_t> Strides(const kiln::v1::TensorMeta& m) {
  return {m.strides().begin(), m.strides().end()};
}

bool SameLayout(const kiln::v1::TensorMeta& a, const kiln::v1::TensorMeta& b) {
  return a.dtype() == b.dtype() && Sizes(a) == Sizes(b) && Strides(a) == Strides(b);
}

bool IsUnitScalar(const Argument& a) {
  return (a.kind_case() == Argument::kIntValue && a.int_value() == 1) ||
         (a.kind_case() == Argument::kFloatValue && a.float_value() == 1.0);
}

std::optional<ProductReader> ReaderOfProduct(const Graph& graph, const SoleReaders& sole,
                                             uint32_t product, int64_t columns) {
  ProductReader out;
  out.reader = sole.Of(product);
  out.value = product;
  if (out.reader < 0) return std::nullopt;
  const Node& n = graph.nodes(out.reader);
  if (!IsReshapeLike(n.op()) || n.outputs_size() != 1 || n.args_size() == 0 ||
      n.args(0).kind_case() != Argument::kValue) {
    return out;
  }
  const kiln::v1::TensorMeta& v = n.outputs(0).meta();
  if (!IsRowMajor(v) || v.sizes_size() < 2 || v.sizes(v.sizes_size() - 1) != columns ||
      v.storage_offset() != 0) {
    return std::nullopt;
  }
  out.reshape = out.reader;
  out.viewed = n.outputs(0);
  out.value = n.outputs(0).id();
  out.reader = sole.Of(out.value);
  if (out.reader < 0) return std::nullopt;
  return out;
}

std::vector<Node> DefineThroughReshape(Node gemm, const ProductReader& read,
                                       const kiln::v1::Value& result, ValueIndex& index) {
  std::vector<Node> nodes;
  if (!read.viewed) {
    *gemm.mutable_outputs(0) = result;
    nodes.push_back(std::move(gemm));
    return nodes;
  }
  gemm.mutable_outputs(0)->set_id(index.next_id++);
  Node view;
  view.set_op("aten::view");
  view.add_args()->set_value(gemm.outputs(0).id());
  auto* sizes = view.add_args()->mutable_int_list();
  for (int64_t d : result.meta().sizes()) sizes->add_values(d);
  *view.add_outputs() = result;
  nodes.push_back(std::move(gemm));
  nodes.push_back(std::move(view));
  return nodes;
}

std::optional<uint32_t> OtherAddend(const Node& add, uint32_t value) {
  if (add.op() != "aten::add.Tensor" || add.outputs_size() != 1 ||
      !(add.args_size() == 2 ||
        (add.args_size() == 3 && add.args(2).name().empty() && IsUnitScalar(add.args(2)))) ||
      add.args(0).kind_case() != Argument::kValue || add.args(1).kind_case() != Argument::kValue ||
      !add.args(0).name().empty() || !add.args(1).name().empty() ||
      add.args(0).value() == add.args(1).value()) {
    return std::nullopt;
  }
  if (add.args(0).value() == value) return add.args(1).value();
  if (add.args(1).value() == value) return add.args(0).value();
  return std::nullopt;
}

Graph ReplaceNodes(const Graph& graph, std::unordered_map<int, std::vector<Node>> replace) {
  if (replace.empty()) return graph;
  Graph out = EmptyLike(graph);
  for (int i = 0; i < graph.nodes_size(); ++i) {
    auto it = replace.find(i);
    if (it == replace.end()) {
      *out.add_nodes() = graph.nodes(i);
    } else {
      for (Node& n : it->second) *out.add_nodes() = std::move(n);
    }
  }
  return out;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

}  // namespace kiln::compiler
