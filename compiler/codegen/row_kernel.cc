// RowKernel: the order of a row-wise kernel's code, the values each pass recomputes, and the
// reductions spelled as passes a target supplies.
#include "compiler/codegen/row_kernel.h"

#include <algorithm>
#include <unordered_set>

#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {

RowKernel::RowKernel(const kiln::v1::Graph& graph, const FusedProgram& program, int index,
                     kiln::v1::DeviceKind device, const KernelDialect& dialect)
    : graph_(graph),
      program_(program),
      g_(program.groups[index]),
      index_(index),
      local_(graph, g_),
      dialect_(dialect),
      rank_(static_cast<int>(g_.sizes.size())),
      outer_(g_.outer_rank),
      length_([&] {
        int64_t n = 1;
        for (int d = outer_; d < rank_; ++d) n *= g_.sizes[d];
        return n;
      }()),
      rows_(graph, program, index, device) {}

void RowKernel::EmitRows(std::string& indent) {
  for (int ni : g_.nodes) {
    const auto& node = graph_.nodes(ni);
    if (auto r = rows_.ReductionOf(node)) {
      EmitReduction(node, *r, indent);
    } else if (rows_.IsRowNode(node)) {
      EmitRowNode(node, indent);
    } else {
      continue;  // full-space nodes are computed inside the passes that need them
    }
    bool stored = false;
    for (const auto& out : node.outputs()) {
      stored |= std::find(g_.outputs.begin(), g_.outputs.end(), out.id()) != g_.outputs.end();
    }
    if (!stored) continue;
    const std::string guard = RowStoreGuard();
    std::string at = indent;
    if (!guard.empty()) {
      body_ << indent << guard << "\n";
      at += "  ";
    }
    OpenLanes(at);
    for (const auto& out : node.outputs()) StoreIfOutput(out.id(), false, rows_var_, at, body_);
    CloseLanes(at);
    if (!guard.empty()) body_ << indent << "}\n";
  }
  std::vector<uint32_t> full_outputs;
  for (uint32_t id : g_.outputs) {
    if (rows_.IsFullNode(id)) full_outputs.push_back(id);
  }
  if (!full_outputs.empty()) {
    const Vars vars = OpenPass(indent, "", full_outputs);
    for (uint32_t id : full_outputs) StoreIfOutput(id, true, vars, indent, body_);
    ClosePass(indent);
  }
}

void RowKernel::EmitRowNode(const kiln::v1::Node& node, std::string& indent) {
  const auto& out = node.outputs(0);
  const std::string t = ComputeType(out.meta().dtype());
  const std::string name = local_("r", out.id());
  if (lanes_ > 0) body_ << indent << t << " " << name << "[" << lanes_ << "];\n";
  // Row-context loads of a lane kernel live in the lane loop only.
  Vars local = rows_var_;
  Vars& vars = lanes_ > 0 ? local : rows_var_;
  OpenLanes(indent);
  for (uint32_t id : ValuesRead(node)) Bind(id, indent, false, vars);
  body_ << indent << (lanes_ > 0 ? Lane(name) : "const " + t + " " + name) << " = "
        << NodeExpression(node, vars, dialect_.rounded) << ";\n";
  CloseLanes(indent);
  rows_var_[out.id()] = Lane(name);
}

RowKernel::Vars RowKernel::OpenPass(std::string& indent, const std::string& clause,
                                    const std::vector<uint32_t>& targets) {
  // The full-space nodes the targets depend on and no earlier pass left behind.
  std::unordered_set<uint32_t> needed;
  std::vector<uint32_t> stack(targets.begin(), targets.end());
  while (!stack.empty()) {
    const uint32_t id = stack.back();
    stack.pop_back();
    if (held_.count(id) || !rows_.IsFullNode(id) || !needed.insert(id).second) continue;
    for (uint32_t r : ValuesRead(graph_.nodes(rows_.Producer(id)))) stack.push_back(r);
  }
  OpenPassLoops(indent, clause, targets);
  Vars vars = rows_var_;
  for (const auto& [id, element] : held_) vars[id] = element;
  for (uint32_t id : targets) Bind(id, indent, true, vars);
  for (int ni : g_.nodes) {
    const auto& node = graph_.nodes(ni);
    const auto& out = node.outputs(0);
    if (!needed.count(out.id())) continue;
    for (uint32_t id : ValuesRead(node)) Bind(id, indent, true, vars);
    const std::string name = local_("v", out.id());
    body_ << indent << "const " << ComputeType(out.meta().dtype()) << " " << name << " = "
          << NodeExpression(node, vars, dialect_.rounded) << ";\n";
    vars[out.id()] = name;
    Computed(out.id(), name, indent);
  }
  EndPass(vars, indent);
  return vars;
}

void RowKernel::Fold(const Reduction& r, const std::string& t, const std::string& clause,
                     const std::string& statement, std::string& indent) {
  const Vars vars = OpenPass(indent, clause, {r.input});
  body_ << indent << "const " << t << " x = " << vars.at(r.input) << ";\n";
  body_ << indent << statement << "\n";
  ClosePass(indent);
}

void RowKernel::Bind(uint32_t id, const std::string& indent, bool inner, Vars& vars) {
  rows_.BindInput(id, inner, dialect_.load, indent, body_, vars);
}

void RowKernel::StoreIfOutput(uint32_t id, bool inner, const Vars& vars, const std::string& indent,
                              std::ostream& o) const {
  auto it = std::find(g_.outputs.begin(), g_.outputs.end(), id);
  if (it == g_.outputs.end()) return;
  const auto& m = *program_.meta.at(id);
  // Output strides over the group's space: a full value or a keepdim row has the space's rank;
  // a row without keepdim has the kept dims only.
  std::vector<int64_t> strides(rank_, 0);
  for (int d = 0; d < m.sizes_size() && d < rank_; ++d) {
    strides[d] = m.sizes(d) == 1 ? 0 : m.strides(d);
  }
  o << indent << "out" << (it - g_.outputs.begin()) << "[" << rows_.Index(0, strides, inner)
    << "] = " << dialect_.store(m.dtype(), vars.at(id)) << ";\n";
}

std::string RowKernel::Lane(const std::string& name) const {
  return lanes_ > 0 ? name + "[kiln_v]" : name;
}

void RowKernel::EmitReduction(const kiln::v1::Node& node, const Reduction& r, std::string& indent) {
  const auto dtype = node.outputs(0).meta().dtype();
  const std::string t = ComputeType(dtype);
  const std::string k = std::to_string(local_.Number(node.outputs(0).id()));
  const std::string count = "(" + t + ")" + std::to_string(length_);
  auto define = [&](const kiln::v1::Value& out, const std::string& value) {
    rows_var_[out.id()] =
        DefineRow(t, local_("r", out.id()), dialect_.rounded(dtype, value), indent);
  };
  const std::string acc = "acc" + k;
  switch (r.kind) {
    case ReductionKind::kSum:
    case ReductionKind::kMean: {
      const std::string sum = SumOverRow(
          r, t, acc, [](const std::string& a) { return a + " += x;"; }, indent);
      define(node.outputs(0), r.kind == ReductionKind::kMean ? sum + " / " + count : sum);
      break;
    }
    case ReductionKind::kAmax:
    case ReductionKind::kAmin:
      define(node.outputs(0),
             ExtremumOverRow(r, t, r.kind == ReductionKind::kAmax, acc, k, indent));
      break;
    case ReductionKind::kVar:
    case ReductionKind::kStd:
    case ReductionKind::kVarMean: {
      // Two passes: the mean, then the sum of squared deviations from it.
      const std::string sum = SumOverRow(
          r, t, acc, [](const std::string& a) { return a + " += x;"; }, indent);
      const std::string mean = DefineRow(t, "mean" + k, sum + " / " + count, indent);
      const std::string m2 = SumOverRow(
          r, t, "m2" + k,
          [&](const std::string& a) {
            return "const " + t + " d = x - " + mean + "; " + a + " += d * d;";
          },
          indent);
      define(node.outputs(0), VarianceExpression(r, m2, count, t, dialect_.math));
      if (r.kind == ReductionKind::kVarMean) define(node.outputs(1), mean);
      break;
    }
  }
}

}  // namespace kiln::compiler
