// Library-op selection for CUDA targets (see cuda_library_passes.h).
#include "compiler/passes/cuda_library_passes.h"

#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "compiler/ir/graph_index.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {

using kiln::v1::Argument;
using kiln::v1::Graph;
using kiln::v1::Node;
using kiln::v1::TensorMeta;

namespace {

bool PositionalValue(const Argument& a) {
  return a.kind_case() == Argument::kValue && a.name().empty();
}

}  // namespace

Graph LinearBiasAsGemmEpilogue(const Graph& graph, PassStats* stats) {
  ValueIndex index = IndexValues(graph);
  const SoleReaders sole(graph);
  const std::unordered_map<uint32_t, std::vector<int>> readers = Readers(graph);
  const std::unordered_set<uint32_t> results = GraphOutputs(graph);
  std::unordered_map<int, std::vector<Node>> replace;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& mm = graph.nodes(i);
    if (mm.op() != "aten::mm" || mm.args_size() != 2 || mm.outputs_size() != 1 ||
        !PositionalValue(mm.args(0)) || !PositionalValue(mm.args(1))) {
      continue;
    }
    const TensorMeta& y = mm.outputs(0).meta();
    if (!IsFloatingDType(y.dtype()) || y.sizes_size() != 2 || !IsRowMajor(y) ||
        y.storage_offset() != 0) {
      continue;
    }
    const int64_t columns = y.sizes(1);
    std::vector<int> absorbed{i};
    const std::optional<ProductReader> read =
        ReaderOfProduct(graph, sole, mm.outputs(0).id(), columns);
    if (!read) continue;
    if (read->reshape >= 0) absorbed.push_back(read->reshape);
    const uint32_t value = read->value;
    const Node* n = &graph.nodes(read->reader);
    const std::optional<uint32_t> bias = OtherAddend(*n, value);
    if (!bias || !results.count(n->outputs(0).id()) || readers.count(n->outputs(0).id()) != 0) {
      continue;
    }
    const TensorMeta& bm = *index.meta.at(*bias);
    const TensorMeta& sum = n->outputs(0).meta();
    if (bm.dtype() != y.dtype() || bm.sizes_size() != 1 || bm.sizes(0) != columns ||
        (columns > 1 && bm.strides(0) != 1) || !SameLayout(sum, *index.meta.at(value))) {
      continue;
    }
    absorbed.push_back(read->reader);

    Node addmm;
    addmm.set_op("aten::addmm");
    addmm.add_args()->set_value(*bias);
    *addmm.add_args() = mm.args(0);
    *addmm.add_args() = mm.args(1);
    *addmm.add_outputs() = mm.outputs(0);
    std::vector<Node> nodes = DefineThroughReshape(std::move(addmm), *read, n->outputs(0), index);
    for (int k : absorbed) replace[k] = {};
    replace[absorbed.back()] = std::move(nodes);
    if (stats) ++stats->gemm_bias_epilogues;
  }
  return ReplaceNodes(graph, std::move(replace));
}

}  // namespace kiln::compiler
