// RowGroup: the classification of a row-wise group's values both generators emit code from.
#include "compiler/codegen/row_group.h"

#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {

RowGroup::RowGroup(const kiln::v1::Graph& graph, const FusedProgram& program, int index,
                   kiln::v1::DeviceKind device)
    : graph_(graph), program_(program), g_(program.groups[index]), device_(device) {
  for (int ni : g_.nodes) {
    for (const auto& out : graph_.nodes(ni).outputs()) producer_[out.id()] = ni;
  }
  for (size_t i = 0; i < g_.input_ids.size(); ++i) {
    input_of_[g_.input_ids[i]] = static_cast<int>(i);
  }
}

std::optional<Reduction> RowGroup::ReductionOf(const kiln::v1::Node& node) const {
  return MatchReduction(node, program_.meta, device_);
}

bool RowGroup::IsRowNode(const kiln::v1::Node& node) const {
  if (FindPointwise(node.op()) == nullptr) return false;
  return std::vector<int64_t>(node.outputs(0).meta().sizes().begin(),
                              node.outputs(0).meta().sizes().end()) == RowShape(g_);
}

bool RowGroup::IsFullNode(uint32_t id) const {
  const int p = Producer(id);
  if (p < 0) return false;
  const auto& node = graph_.nodes(p);
  return !ReductionOf(node) && !IsRowNode(node);
}

int RowGroup::Producer(uint32_t id) const {
  auto p = producer_.find(id);
  return p == producer_.end() ? -1 : p->second;
}

int RowGroup::InputOf(uint32_t id) const {
  auto i = input_of_.find(id);
  return i == input_of_.end() ? -1 : i->second;
}

std::string RowGroup::Index(int64_t offset, const std::vector<int64_t>& strides, bool inner) const {
  std::string e = std::to_string(offset);
  for (int d = 0; d < rank(); ++d) {
    if (d >= outer() && !inner) break;
    if (d >= static_cast<int>(strides.size()) || strides[d] == 0 || g_.sizes[d] == 1) continue;
    e += " + " + std::string(d < outer() ? "i" : "j") + std::to_string(d) + " * " +
         std::to_string(strides[d]);
  }
  return e;
}

void RowGroup::BindInput(uint32_t id, bool inner, LoadFn load, const std::string& indent,
                         std::ostream& out, std::unordered_map<uint32_t, std::string>& vars) const {
  if (vars.count(id)) return;
  const int i = InputOf(id);
  if (i < 0) return;
  if (g_.inputs[i].literal) {
    vars[id] = "lit" + std::to_string(i);
    return;
  }
  const auto& m = *program_.meta.at(g_.inputs[i].base);
  const std::string name = (inner ? "a" : "ra") + std::to_string(i);
  out << indent << "const " << ComputeType(m.dtype()) << " " << name << " = "
      << load(m.dtype(), "in" + std::to_string(i) + "[" +
                             Index(g_.inputs[i].offset, g_.inputs[i].strides, inner) + "]")
      << ";\n";
  vars[id] = name;
}

}  // namespace kiln::compiler
