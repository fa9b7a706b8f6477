// Greedy vertical fusion over the topological order, horizontal fusion of the kernels it leaves,
// view folding, and dead-step removal.
#include "compiler/passes/fusion.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>

#include "compiler/ir/graph_index.h"
#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"
#include "compiler/ir/reduction_ops.h"
#include "compiler/ir/window_ops.h"
#include "compiler/passes/bound_prologue.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;
using kiln::v1::Graph;
using kiln::v1::Node;
using kiln::v1::TensorMeta;
using MetaMap = std::unordered_map<uint32_t, const TensorMeta*>;

// A C++ expression in the compute type for the single element of a one-element constant, or
// nullopt (then the kernel reads the constant's memory).
std::optional<std::string> ConstantLiteral(const kiln::v1::Constant& c) {
  const TensorMeta& m = c.value().meta();
  int64_t numel = 1;
  for (int64_t s : m.sizes()) numel *= s;
  const std::string& bytes = c.data();
  if (numel != 1 || static_cast<int>(bytes.size()) != ElementSize(m.dtype())) return std::nullopt;
  auto read = [&](auto v) {
    std::memcpy(&v, bytes.data(), sizeof v);
    return v;
  };
  auto floating = [](double v, const char* type) -> std::string {
    if (std::isnan(v)) return std::string("(") + type + ")NAN";
    if (std::isinf(v)) return std::string("(") + type + ")" + (v > 0 ? "INFINITY" : "-INFINITY");
    char buf[64];
    std::snprintf(buf, sizeof buf, "(%s)%a", type, v);  // hex: exact
    return buf;
  };
  switch (m.dtype()) {
    case kiln::v1::DTYPE_FLOAT32:
      return floating(read(float{}), "float");
    case kiln::v1::DTYPE_FLOAT64:
      return floating(read(double{}), "double");
    case kiln::v1::DTYPE_BFLOAT16: {
      uint32_t bits = static_cast<uint32_t>(read(uint16_t{})) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return floating(f, "float");
    }
    case kiln::v1::DTYPE_FLOAT16: {
      const uint16_t h = read(uint16_t{});
      const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
      double v = exponent == 0    ? std::ldexp(mantissa, -24)
                 : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                  : std::ldexp(mantissa + 1024, exponent - 25);
      return floating((h & 0x8000) ? -v : v, "float");
    }
    case kiln::v1::DTYPE_INT8:
      return "INT64_C(" + std::to_string(read(int8_t{})) + ")";
    case kiln::v1::DTYPE_INT16:
      return "INT64_C(" + std::to_string(read(int16_t{})) + ")";
    case kiln::v1::DTYPE_INT32:
      return "INT64_C(" + std::to_string(read(int32_t{})) + ")";
    case kiln::v1::DTYPE_UINT8:
      return "INT64_C(" + std::to_string(read(uint8_t{})) + ")";
    case kiln::v1::DTYPE_INT64: {
      const int64_t v = read(int64_t{});
      // INT64_MIN has no literal of its own.
      if (v == INT64_MIN) return "INT64_MIN";
      return "INT64_C(" + std::to_string(v) + ")";
    }
    case kiln::v1::DTYPE_BOOL:
      return read(uint8_t{}) ? "true" : "false";
    default:
      return std::nullopt;
  }
}

// Values a fused step reads from outside itself and values it defines.
struct StepValues {
  std::unordered_set<uint32_t> reads, defs;
};

StepValues ValuesOfStep(const Graph& graph, const FusedProgram& program, const FusedStep& step) {
  StepValues v;
  const std::vector<int> one{step.node};
  const std::vector<int>& nodes = step.is_kernel ? program.groups[step.group].nodes : one;
  for (int i : nodes) {
    for (const auto& out : graph.nodes(i).outputs()) v.defs.insert(out.id());
  }
  for (int i : nodes) {
    for (uint32_t id : ValuesRead(graph.nodes(i))) {
      if (!v.defs.count(id)) v.reads.insert(id);
    }
  }
  return v;
}

// How many earlier kernels of the same space a kernel is tried against: merging far-apart
// kernels is rarely legal in a deep graph and keeps their results alive longer.
constexpr int kMergeCandidates = 8;

// Horizontal fusion: merges kernel steps over the same iteration space when no step between
// them lies on a path from the earlier to the later one, so one kernel with several outputs
// replaces two launches and two passes over the thread pool (and loads shared inputs once).
//
// - The merged kernel runs where the earlier one did, after the steps between the two that the
//   later one depends on (moved up, in their order) and before the others. Steps are pure
//   (the IR has no in-place ops) except that random ops draw from one generator: one never
//   moves ahead of another.
// - Iteration spaces must be equal. A kernel over [C] beside one over [N, C, H, W] would need
//   two loop nests in one function (saving only the launch, with the parallel range sized for
//   one of them) or masked iterations over the larger space; per-channel vectors computed from
//   parameters are prologue work anyway.
// - Plain groups merge even when the later reads the earlier directly (that is vertical fusion
//   across a library step that does not read it). Row-wise groups merge only with row-wise
//   groups of the same kept dims, when neither reads the other.
// - Groups storing values of different layouts stay apart: one of them would be stored against
//   its memory order.
// Among the legal candidates a kernel goes to the one sharing most of its inputs, else the
// nearest. `node_group` follows the merges; merged-away groups are left empty.
void MergeIndependentGroups(const Graph& graph, FusedProgram& program,
                            std::vector<int>& node_group) {
  std::vector<FusedStep>& steps = program.steps;
  std::vector<StepValues> values;
  for (const FusedStep& step : steps) values.push_back(ValuesOfStep(graph, program, step));
  const NondeterministicOps random(graph);
  auto is_random = [&](const FusedStep& step) {
    return !step.is_kernel && random.Contains(graph.nodes(step.node).op());
  };
  const std::unordered_set<uint32_t> returned(graph.outputs().begin(), graph.outputs().end());
  const std::unordered_map<uint32_t, std::vector<int>> readers = Readers(graph);
  // Adds the strides (0 on size-1 dims) of the values group `g` stores over its whole space: the
  // generated loop nest walks the memory order of the first.
  auto add_layouts = [&](int g, std::set<std::vector<int64_t>>& layouts) {
    const FusedGroup& group = program.groups[g];
    for (int i : group.nodes) {
      for (const auto& out : graph.nodes(i).outputs()) {
        if (Sizes(out.meta()) != group.sizes) continue;  // rows of a row-wise group
        bool stored = returned.count(out.id()) != 0;
        if (auto r = readers.find(out.id()); r != readers.end()) {
          for (int reader : r->second) stored = stored || node_group[reader] != g;
        }
        if (!stored) continue;
        std::vector<int64_t> strides = Strides(out.meta());
        for (int d = 0; d < out.meta().sizes_size(); ++d) {
          if (out.meta().sizes(d) == 1) strides[d] = 0;
        }
        layouts.insert(std::move(strides));
      }
    }
  };
  auto compatible = [&](int a, int b) {
    const FusedGroup &ga = program.groups[a], &gb = program.groups[b];
    if (ga.sizes != gb.sizes || ga.outer_rank != gb.outer_rank || ga.convolution >= 0 ||
        gb.convolution >= 0) {
      return false;
    }
    std::set<std::vector<int64_t>> layouts;
    add_layouts(a, layouts);
    add_layouts(b, layouts);
    return layouts.size() <= 1;
  };
  // For kernel steps p < q: which steps between them q depends on (by step index), or nullopt
  // when one of those depends on p or moving them up would reorder random ops.
  auto feeders = [&](int p, int q) -> std::optional<std::vector<bool>> {
    std::vector<bool> depends_on_p(q), feeds_q(q);
    std::unordered_set<uint32_t> from_p = values[p].defs;
    for (int s = p + 1; s < q; ++s) {
      for (uint32_t id : values[s].reads) depends_on_p[s] = depends_on_p[s] || from_p.count(id);
      if (depends_on_p[s]) from_p.insert(values[s].defs.begin(), values[s].defs.end());
    }
    std::unordered_set<uint32_t> needed = values[q].reads;
    if (program.groups[steps[p].group].outer_rank >= 0) {
      for (uint32_t id : values[p].defs) {
        if (needed.count(id)) return std::nullopt;
      }
    }
    for (int s = q - 1; s > p; --s) {
      for (uint32_t id : values[s].defs) feeds_q[s] = feeds_q[s] || needed.count(id);
      if (!feeds_q[s]) continue;
      if (depends_on_p[s]) return std::nullopt;
      needed.insert(values[s].reads.begin(), values[s].reads.end());
    }
    bool random_stays = false;
    for (int s = p + 1; s < q; ++s) {
      if (!is_random(steps[s])) continue;
      if (feeds_q[s] && random_stays) return std::nullopt;
      random_stays = random_stays || !feeds_q[s];
    }
    return feeds_q;
  };
  for (int q = 0; q < static_cast<int>(steps.size()); ++q) {
    if (!steps[q].is_kernel) continue;
    const FusedGroup& later = program.groups[steps[q].group];
    int best = -1, best_shared = -1;
    std::vector<bool> best_feeds;
    int tried = 0;
    for (int p = q - 1; p >= 0 && tried < kMergeCandidates; --p) {
      if (!steps[p].is_kernel || !compatible(steps[p].group, steps[q].group)) continue;
      ++tried;
      auto feeds = feeders(p, q);
      if (!feeds) continue;
      int shared = 0;
      for (uint32_t id : values[q].reads) shared += values[p].reads.count(id);
      if (shared > best_shared) best = p, best_shared = shared, best_feeds = std::move(*feeds);
    }
    if (best < 0) continue;
    FusedGroup& into = program.groups[steps[best].group];
    for (int i : later.nodes) {
      into.nodes.push_back(i);
      node_group[i] = steps[best].group;
    }
    program.groups[steps[q].group].nodes.clear();
    values[best] = ValuesOfStep(graph, program, steps[best]);
    // Feeders of the later kernel, the merged kernel, the other steps between the two.
    std::vector<int> order;
    for (int s = best + 1; s < q; ++s) {
      if (best_feeds[s]) order.push_back(s);
    }
    order.push_back(best);
    for (int s = best + 1; s < q; ++s) {
      if (!best_feeds[s]) order.push_back(s);
    }
    std::vector<FusedStep> moved_steps;
    std::vector<StepValues> moved_values;
    for (int s : order) {
      moved_steps.push_back(steps[s]);
      moved_values.push_back(std::move(values[s]));
    }
    std::move(moved_steps.begin(), moved_steps.end(), steps.begin() + best);
    std::move(moved_values.begin(), moved_values.end(), values.begin() + best);
    steps.erase(steps.begin() + q);
    values.erase(values.begin() + q);
    --q;
  }
}

}  // namespace

bool FoldableView(const Node& node, const MetaMap& meta) {
  if (node.outputs_size() != 1 || node.args_size() == 0 ||
      node.args(0).kind_case() != Argument::kValue) {
    return false;
  }
  if (IsAlwaysView(node.op())) return true;
  if (!MayAliasInput(node.op())) return false;
  // reshape/contiguous of a row-major input never copies: the result is row-major at the
  // input's offset. Of anything else it may have copied, and its strides describe new memory.
  auto in = meta.find(node.args(0).value());
  const TensorMeta& out = node.outputs(0).meta();
  return in != meta.end() && IsRowMajor(*in->second) && IsRowMajor(out) &&
         in->second->storage_offset() == out.storage_offset() && in->second->dtype() == out.dtype();
}

bool IsFusable(const Node& node, const MetaMap& meta, kiln::v1::DeviceKind device) {
  const PointwiseOp* op = FindPointwise(node.op());
  if (op == nullptr || node.outputs_size() != 1) return false;
  const TensorMeta& out = node.outputs(0).meta();
  if (out.device().kind() != device) return false;
  const std::string type = ComputeType(out.dtype());
  if (type.empty()) return false;
  auto bound = BindArguments(node, op->formals);
  if (!bound) return false;
  std::vector<std::optional<Operand>> operands(op->formals.size());
  for (size_t i = 0; i < op->formals.size(); ++i) {
    const Argument* a = (*bound)[i];
    if (a == nullptr || a->kind_case() == Argument::kNone) continue;
    if (a->kind_case() == Argument::kValue) {
      if (!op->IsTensorFormal(op->formals[i])) return false;
      auto it = meta.find(a->value());
      if (it == meta.end() || ComputeType(it->second->dtype()).empty()) return false;
      if (it->second->device().kind() != device ||
          it->second->device().index() != out.device().index()) {
        return false;
      }
      // Inputs broadcast to the output: never more dims, each size equal or 1.
      const auto& in = it->second->sizes();
      if (in.size() > out.sizes().size()) return false;
      for (int d = 0; d < in.size(); ++d) {
        int64_t o = out.sizes(out.sizes().size() - in.size() + d);
        if (in[d] != o && in[d] != 1) return false;
      }
      operands[i] = Operand{"x", true, 0};
      continue;
    }
    // How the result is stored (dtype, device, memory format, ...) is its TensorMeta: every
    // operand and the output are checked to be tensors of handled dtypes on `device` above and
    // below.
    if (op->IsStorageFormal(op->formals[i])) continue;
    if (a->kind_case() == Argument::kStringValue && op->formals[i] != "rounding_mode" &&
        op->formals[i] != "approximate") {
      return false;
    }
    auto literal = ScalarLiteral(*a);
    if (!literal) return false;
    operands[i] = Operand{*literal, false, ScalarValue(*a)};
  }
  for (size_t i = 0; i < op->formals.size(); ++i) {
    if (!operands[i] && op->IsTensorFormal(op->formals[i]) && i == 0) return false;
  }
  return op->Emit(operands, type).has_value();
}

FusedProgram FuseGraph(const Graph& graph, const std::unordered_set<uint32_t>* bound,
                       kiln::v1::DeviceKind device, const std::unordered_set<int>* library_nodes) {
  FusedProgram program;
  MetaMap& meta = program.meta;
  std::unordered_map<uint32_t, int> producer;  // value -> node index
  for (const auto& v : graph.inputs()) meta[v.id()] = &v.meta();
  for (const auto& c : graph.constants()) meta[c.value().id()] = &c.value().meta();
  for (int i = 0; i < graph.nodes_size(); ++i) {
    for (const auto& out : graph.nodes(i).outputs()) {
      meta[out.id()] = &out.meta();
      producer[out.id()] = i;
    }
  }
  std::unordered_map<uint32_t, const kiln::v1::Constant*> constants;
  for (const auto& c : graph.constants()) constants[c.value().id()] = &c;
  const auto& reads = ValuesRead;

  // 1. Greedy grouping in topological order. A library node that does not read the open group
  // is placed before it (its inputs all exist already), so groups grow across unrelated calls.
  // A reduction of the open group's space joins it (the group becomes row-wise), and so do
  // pointwise nodes over its rows.
  std::vector<int> node_group(graph.nodes_size(), -1);
  int open = -1;
  std::unordered_set<uint32_t> open_defs, open_rows;  // values of the open group; row values
  auto close = [&] {
    if (open >= 0) program.steps.push_back({true, -1, open});
    open = -1;
    open_defs.clear();
    open_rows.clear();
  };
  auto start = [&](std::vector<int64_t> sizes, int outer_rank) {
    close();
    program.groups.push_back(FusedGroup{{}, std::move(sizes), {}, {}, {}, outer_rank, -1, std::nullopt});
    open = static_cast<int>(program.groups.size()) - 1;
  };
  // Whether node `n` may join the open group as a full node (`row` false) or a row node: the
  // open group's values it reads are full values or keepdim rows (full nodes), or rows of its
  // own shape (row nodes).
  auto reads_fit = [&](const Node& n, bool row) {
    const FusedGroup& g = program.groups[open];
    for (uint32_t id : reads(n)) {
      if (!open_defs.count(id)) continue;
      const bool is_row = open_rows.count(id) != 0;
      if (row && !is_row) return false;
      if (is_row && Sizes(*meta[id]) != RowShape(g)) return false;
    }
    return true;
  };
  auto add = [&](int i, bool row) {
    program.groups[open].nodes.push_back(i);
    node_group[i] = open;
    for (const auto& out : graph.nodes(i).outputs()) {
      open_defs.insert(out.id());
      if (row) open_rows.insert(out.id());
    }
  };
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& n = graph.nodes(i);
    // Prologue work (bound values: folded weights, casts of parameters) runs once per parameter
    // version: ATen's kernels do it, none is generated. A generated kernel would cost its share
    // of the artifact's build (on CUDA, half of a convolution net's NVRTC time) to save
    // microseconds once.
    const bool is_bound = bound != nullptr && IsBoundNode(n, *bound);
    if (is_bound || (library_nodes != nullptr && library_nodes->count(i))) {
      close();
      program.steps.push_back({false, i, -1});
      continue;
    }
    if (IsFusable(n, meta, device)) {
      std::vector<int64_t> sizes = Sizes(n.outputs(0).meta());
      if (open >= 0 && program.groups[open].sizes == sizes && reads_fit(n, false)) {
        add(i, false);
      } else if (open >= 0 && program.groups[open].outer_rank >= 0 &&
                 sizes == RowShape(program.groups[open]) && reads_fit(n, true)) {
        add(i, true);
      } else {
        start(sizes, -1);
        add(i, false);
      }
      continue;
    }
    if (auto r = MatchReduction(n, meta, device)) {
      std::vector<int64_t> sizes = Sizes(*meta[r->input]);
      int64_t outer = 1, total = 1;
      for (size_t d = 0; d < sizes.size(); ++d) {
        total *= sizes[d];
        if (static_cast<int>(d) < r->outer_rank) outer *= sizes[d];
      }
      // Rows are reduced by one thread each: few long rows stay with ATen's parallel reductions.
      if (outer >= 64 || total <= (1 << 16)) {
        const bool joins = open >= 0 && program.groups[open].sizes == sizes &&
                           program.groups[open].convolution < 0 &&
                           (program.groups[open].outer_rank < 0 ||
                            program.groups[open].outer_rank == r->outer_rank) &&
                           reads_fit(n, false);
        if (!joins) start(sizes, r->outer_rank);
        program.groups[open].outer_rank = r->outer_rank;
        add(i, true);
        continue;
      }
    }
    if (MatchDepthwiseConvolution(n, meta, device)) {
      start(Sizes(n.outputs(0).meta()), -1);
      program.groups[open].convolution = i;
      add(i, false);
      continue;
    }
    for (uint32_t id : reads(n)) {
      if (open_defs.count(id)) {
        close();
        break;
      }
    }
    program.steps.push_back({false, i, -1});
  }
  close();

  // 2. Horizontal fusion, then groups numbered in execution order.
  MergeIndependentGroups(graph, program, node_group);
  std::vector<FusedGroup> groups;
  for (FusedStep& step : program.steps) {
    if (!step.is_kernel) continue;
    FusedGroup& g = program.groups[step.group];
    step.group = static_cast<int>(groups.size());
    for (int i : g.nodes) node_group[i] = step.group;
    groups.push_back(std::move(g));
  }
  program.groups = std::move(groups);

  // 3. Each group's inputs (views folded into strides) and materialized outputs.
  std::unordered_set<uint32_t> graph_outputs(graph.outputs().begin(), graph.outputs().end());
  std::unordered_map<uint32_t, std::vector<int>> consumers;  // value -> reading nodes
  for (int i = 0; i < graph.nodes_size(); ++i) {
    for (uint32_t id : reads(graph.nodes(i))) consumers[id].push_back(i);
  }
  for (size_t g = 0; g < program.groups.size(); ++g) {
    FusedGroup& group = program.groups[g];
    std::unordered_set<uint32_t> defs, seen;
    for (int i : group.nodes) {
      for (const auto& out : graph.nodes(i).outputs()) defs.insert(out.id());
    }
    const int rank = static_cast<int>(group.sizes.size());
    for (int i : group.nodes) {
      for (uint32_t id : reads(graph.nodes(i))) {
        if (defs.count(id) || !seen.insert(id).second) continue;
        group.input_ids.push_back(id);
        // Fold a chain of single-output views: read the base with the view's strides.
        uint32_t base = id;
        while (true) {
          auto p = producer.find(base);
          if (p == producer.end()) break;
          const Node& pn = graph.nodes(p->second);
          if (!FoldableView(pn, meta)) break;
          base = pn.args(0).value();
        }
        const TensorMeta& vm = *meta[id];
        KernelOperand operand;
        operand.base = base;
        if (auto c = constants.find(base); c != constants.end()) {
          operand.literal = ConstantLiteral(*c->second);
        }
        operand.offset = vm.storage_offset() - meta[base]->storage_offset();
        operand.strides.assign(rank, 0);
        const int vr = vm.sizes_size();
        for (int d = 0; d < vr; ++d) {
          if (vm.sizes(d) != 1) operand.strides[rank - vr + d] = vm.strides(d);
        }
        group.inputs.push_back(operand);
      }
    }
    for (int i : group.nodes) {
      for (const auto& out : graph.nodes(i).outputs()) {
        const uint32_t id = out.id();
        bool outside = graph_outputs.count(id) != 0;
        for (int c : consumers[id]) outside = outside || node_group[c] != static_cast<int>(g);
        if (outside) group.outputs.push_back(id);
      }
    }
  }

  // 4. Dead steps: library calls none of whose outputs is read by a later step (kernels read
  // folded bases) or returned. Walk backwards so chains of dead views go at once.
  std::unordered_set<uint32_t> live(graph_outputs);
  std::vector<FusedStep> kept;
  for (auto it = program.steps.rbegin(); it != program.steps.rend(); ++it) {
    if (it->is_kernel) {
      FusedGroup& group = program.groups[it->group];
      // Outputs nobody reads any more (their readers were folded away) are not materialized.
      std::vector<uint32_t> outs;
      for (uint32_t id : group.outputs) {
        if (live.count(id)) outs.push_back(id);
      }
      group.outputs = outs;
      if (group.outputs.empty()) continue;
      for (const KernelOperand& in : group.inputs) {
        if (!in.literal) live.insert(in.base);
      }
      kept.push_back(*it);
      continue;
    }
    const Node& n = graph.nodes(it->node);
    bool used = false;
    for (const auto& out : n.outputs()) used = used || live.count(out.id());
    if (!used) continue;
    for (uint32_t id : reads(n)) live.insert(id);
    kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  program.steps = std::move(kept);
  return program;
}

}  // namespace kiln::compiler
