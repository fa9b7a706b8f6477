// The graph passes. Each walks the nodes once in topological order with a map from removed
// values to the equal values that replace them, rewriting later arguments as it goes.
#include "compiler/passes/graph_passes.h"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ir/graph_index.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"
#include "compiler/ir/reduction_ops.h"
#include "compiler/passes/pass_log.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;
using kiln::v1::Graph;
using kiln::v1::Node;
using kiln::v1::TensorMeta;
using Replacements = std::unordered_map<uint32_t, uint32_t>;

void Rewrite(Node* node, const Replacements& replace) {
  if (replace.empty()) return;
  auto map = [&](uint32_t id) {
    auto it = replace.find(id);
    return it == replace.end() ? id : it->second;
  };
  for (Argument& a : *node->mutable_args()) {
    if (a.kind_case() == Argument::kValue) a.set_value(map(a.value()));
    if (a.kind_case() == Argument::kValueList) {
      for (uint32_t& id : *a.mutable_value_list()->mutable_ids()) id = map(id);
    }
  }
}

bool SameMeta(const TensorMeta& a, const TensorMeta& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

// Ops whose single result holds the same elements as their first input whenever the two have
// the same metadata: views, and copies that changed nothing.
bool IsIdentityWhenMetaMatches(const std::string& op) {
  return MayAliasInput(op) || op == "aten::clone" || op == "aten::_to_copy" ||
         op == "aten::lift_fresh_copy";
}

// x * 1, x / 1 and x - 0 with a literal (addmm's decomposition multiplies by alpha and beta):
// exactly x, bits included, when the result has x's metadata. (x + 0 is not: -0.0 + 0 = +0.0.)
bool IsArithmeticIdentity(const Node& node) {
  if (node.args_size() != 2 || !node.args(1).name().empty()) return false;
  const std::string& op = node.op();
  const bool times = op == "aten::mul.Tensor" || op == "aten::mul.Scalar" ||
                     op == "aten::div.Tensor" || op == "aten::div.Scalar";
  const bool minus = op == "aten::sub.Tensor" || op == "aten::sub.Scalar";
  if (!times && !minus) return false;
  const Argument& a = node.args(1);
  double v;
  if (a.kind_case() == Argument::kIntValue) {
    v = static_cast<double>(a.int_value());
  } else if (a.kind_case() == Argument::kFloatValue) {
    v = a.float_value();
  } else {
    return false;
  }
  return times ? v == 1.0 : v == 0.0;
}

}  // namespace

Graph EliminateDeadCode(const Graph& graph, PassStats* stats) {
  std::unordered_set<uint32_t> live = GraphOutputs(graph);
  std::vector<bool> keep(graph.nodes_size(), false);
  for (int i = graph.nodes_size() - 1; i >= 0; --i) {
    const Node& node = graph.nodes(i);
    // A node without outputs can only be there for an effect: kept.
    bool used = node.outputs_size() == 0;
    for (const auto& out : node.outputs()) used = used || live.count(out.id()) != 0;
    if (!used) {
      if (stats) ++stats->dead_nodes;
      continue;
    }
    keep[i] = true;
    for (uint32_t id : ValuesRead(node)) live.insert(id);
  }
  Graph out = EmptyLike(graph);
  out.clear_constants();
  for (const auto& c : graph.constants()) {
    if (live.count(c.value().id())) {
      *out.add_constants() = c;
    } else if (stats) {
      ++stats->dead_constants;
    }
  }
  for (int i = 0; i < graph.nodes_size(); ++i) {
    if (keep[i]) *out.add_nodes() = graph.nodes(i);
  }
  return out;
}

Graph EliminateCommonSubexpressions(const Graph& graph, PassStats* stats) {
  const std::unordered_set<uint32_t> outputs = GraphOutputs(graph);
  const std::unordered_set<uint32_t> escaping = Escaping(graph);
  const NondeterministicOps random(graph);
  Graph out = EmptyLike(graph);
  Replacements replace;
  // Key: op, arguments (already rewritten) and output metadata -> the first node's outputs.
  std::unordered_map<std::string, std::vector<uint32_t>> seen;
  for (const Node& original : graph.nodes()) {
    Node node = original;
    Rewrite(&node, replace);
    std::string key = node.op();
    key.push_back('\0');
    for (const Argument& a : node.args()) {
      std::string bytes = a.SerializeAsString();
      key += std::to_string(bytes.size()) + ":" + bytes;
    }
    // Two views of one tensor alias it either way; two copies are distinct tensors, which a
    // caller can tell apart once they escape.
    bool keep_distinct = false;
    for (const auto& v : node.outputs()) {
      std::string bytes = v.meta().SerializeAsString();
      key += "|" + std::to_string(bytes.size()) + ":" + bytes;
      keep_distinct = keep_distinct || outputs.count(v.id()) != 0 ||
                      (!MayAliasInput(node.op()) && escaping.count(v.id()) != 0);
    }
    if (!random.Contains(node.op()) && node.outputs_size() > 0) {
      auto [it, inserted] = seen.try_emplace(key);
      if (inserted) {
        for (const auto& v : node.outputs()) it->second.push_back(v.id());
      } else if (!keep_distinct) {
        for (int i = 0; i < node.outputs_size(); ++i) {
          replace[node.outputs(i).id()] = it->second[i];
        }
        if (stats) ++stats->common_nodes;
        continue;
      }
    }
    *out.add_nodes() = std::move(node);
  }
  return out;
}

Graph SimplifyViews(const Graph& graph, PassStats* stats) {
  const std::unordered_set<uint32_t> outputs = GraphOutputs(graph);
  const std::unordered_set<uint32_t> escaping = Escaping(graph);
  const ValueIndex index = IndexValues(graph);
  const auto& meta = index.meta;
  // value -> the input of the reshape-like node (kept, after rewriting) that defines it.
  std::unordered_map<uint32_t, uint32_t> reshape_input;
  Graph out = EmptyLike(graph);
  Replacements replace;
  for (const Node& original : graph.nodes()) {
    Node node = original;
    Rewrite(&node, replace);
    const bool single = node.outputs_size() == 1 && node.args_size() > 0 &&
                        node.args(0).kind_case() == Argument::kValue;
    if (single) {
      const uint32_t in = node.args(0).value(), id = node.outputs(0).id();
      const TensorMeta& out_meta = node.outputs(0).meta();
      const bool copy = !MayAliasInput(node.op());
      if ((IsIdentityWhenMetaMatches(node.op()) || IsArithmeticIdentity(node)) &&
          outputs.count(id) == 0 && !(copy && escaping.count(id)) &&
          SameMeta(*meta.at(in), out_meta)) {
        replace[id] = in;
        if (stats) ++stats->identity_nodes;
        continue;
      }
      if (IsReshapeLike(node.op())) {
        // reshape(reshape(x)) of a row-major x: both are views of x's storage at x's offset, so
        // the outer one reads x directly and the inner one may die.
        auto inner = reshape_input.find(in);
        if (inner != reshape_input.end()) {
          const TensorMeta& base = *meta.at(inner->second);
          const TensorMeta& mid = *meta.at(in);
          if (IsRowMajor(base) && IsRowMajor(mid) && IsRowMajor(out_meta) &&
              mid.storage_offset() == base.storage_offset() &&
              out_meta.storage_offset() == base.storage_offset() && mid.dtype() == base.dtype()) {
            node.mutable_args(0)->set_value(inner->second);
            if (stats) ++stats->folded_views;
          }
        }
        reshape_input[id] = node.args(0).value();
      }
    }
    *out.add_nodes() = std::move(node);
  }
  return out;
}

Graph HoistViewsAbovePointwise(const Graph& graph, PassStats* stats) {
  ValueIndex index = IndexValues(graph);
  const auto& meta = index.meta;
  const auto& producer = index.producer;
  uint32_t& next_id = index.next_id;
  std::unordered_map<uint32_t, int> readers;
  std::unordered_set<uint32_t> computed;  // values a kernel may read: a pointwise op or reduction
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const std::string& op = graph.nodes(i).op();
    const bool kernel = FindPointwise(op) != nullptr || IsReductionOp(op);
    for (uint32_t id : ValuesRead(graph.nodes(i))) {
      ++readers[id];
      if (kernel) computed.insert(id);
    }
  }
  for (uint32_t id : graph.outputs()) ++readers[id];
  // The rewritten pointwise node for reshape `v`, preceded by the reshapes of its full-size
  // operands; empty when the hoist does not apply.
  std::vector<std::vector<Node>> replacement(graph.nodes_size());
  std::vector<bool> rewritten(graph.nodes_size(), false);
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& v = graph.nodes(i);
    if ((v.op() != "aten::view" && v.op() != "aten::_unsafe_view" && v.op() != "aten::reshape") ||
        v.outputs_size() != 1 || v.args_size() == 0 || v.args(0).kind_case() != Argument::kValue) {
      continue;
    }
    // A reshape only library calls read (the 2-D view a matrix product takes) costs nothing
    // where it is; moving it would split the pointwise chain above it from what follows.
    if (!computed.count(v.outputs(0).id())) continue;
    const uint32_t u = v.args(0).value();
    auto p = producer.find(u);
    if (p == producer.end() || readers[u] != 1 || rewritten[p->second]) continue;
    const Node& pw = graph.nodes(p->second);
    const TensorMeta& um = *meta.at(u);
    const TensorMeta& vm = v.outputs(0).meta();
    // Arithmetic only: copies (clone, _to_copy) stay where they are, as a graph output may be
    // a view of one (see Escaping).
    const PointwiseOp* op = FindPointwise(pw.op());
    if (op == nullptr || !op->storage_formals.empty() || pw.outputs_size() != 1 ||
        !IsRowMajor(um) || !IsRowMajor(vm) || um.dtype() != vm.dtype() ||
        um.storage_offset() != vm.storage_offset()) {
      continue;
    }
    const std::vector<int64_t> from = Sizes(um), to = Sizes(vm);
    std::vector<Node> nodes;
    Node moved = pw;
    bool ok = true;
    for (Argument& a : *moved.mutable_args()) {
      if (a.kind_case() == Argument::kValueList) ok = false;
      if (a.kind_case() != Argument::kValue) continue;
      const TensorMeta& am = *meta.at(a.value());
      std::vector<int64_t> as = Sizes(am);
      if (as == from) {
        if (!IsRowMajor(am)) {
          ok = false;
          break;
        }
        Node view;
        view.set_op("aten::view");
        view.add_args()->set_value(a.value());
        auto* view_sizes = view.add_args()->mutable_int_list();  // aten::view(Tensor, int[])
        for (int64_t s : to) view_sizes->add_values(s);
        kiln::v1::Value* out = view.add_outputs();
        out->set_id(next_id++);
        TensorMeta* m = out->mutable_meta();
        *m = am;
        m->clear_sizes();
        m->clear_strides();
        int64_t stride = 1;
        std::vector<int64_t> strides(to.size());
        for (int d = static_cast<int>(to.size()) - 1; d >= 0; --d) {
          strides[d] = stride;
          stride *= to[d];
        }
        for (size_t d = 0; d < to.size(); ++d) {
          m->add_sizes(to[d]);
          m->add_strides(strides[d]);
        }
        a.set_value(out->id());
        nodes.push_back(std::move(view));
        continue;
      }
      // A broadcast operand: its sizes past leading ones must be trailing dims of both shapes.
      size_t lead = 0;
      while (lead < as.size() && as[lead] == 1) ++lead;
      const size_t k = as.size() - lead;
      if (as.size() > to.size() || k > from.size()) {
        ok = false;
        break;
      }
      for (size_t d = 0; d < k && ok; ++d) {
        ok = from[from.size() - k + d] == to[to.size() - k + d];
      }
      if (!ok) break;
    }
    if (!ok) continue;
    *moved.mutable_outputs(0) = v.outputs(0);
    nodes.push_back(std::move(moved));
    replacement[i] = std::move(nodes);
    rewritten[p->second] = true;  // its one reader is gone; dead code removes it
    if (stats) ++stats->hoisted_views;
  }
  Graph out = EmptyLike(graph);
  for (int i = 0; i < graph.nodes_size(); ++i) {
    if (replacement[i].empty()) {
      *out.add_nodes() = graph.nodes(i);
    } else {
      for (Node& n : replacement[i]) *out.add_nodes() = std::move(n);
    }
  }
  return out;
}

Graph RunGraphPasses(const Graph& graph, PassStats* stats, PassLog* log) {
  PassLog none;
  PassLog& passes = log ? *log : none;
  Graph g = passes.After("simplify views", SimplifyViews(graph, stats));
  // Hoisting exposes the next pointwise node above the moved one; a few rounds reach the
  // library call a chain starts from.
  for (int round = 0; round < 4; ++round) {
    PassStats local;
    g = passes.After("hoist views above pointwise", HoistViewsAbovePointwise(g, &local));
    g = passes.After("dead code", EliminateDeadCode(g));
    if (stats) stats->hoisted_views += local.hoisted_views;
    if (local.hoisted_views == 0) break;
  }
  g = passes.After("common subexpressions", EliminateCommonSubexpressions(g, stats));
  return passes.After("dead code", EliminateDeadCode(g, stats));
}

}  // namespace kiln::compiler
