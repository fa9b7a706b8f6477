#include "compiler/codegen/pointwise_kernel.h"

#include <unordered_map>

#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {

GroupAccesses PointwiseAccesses(const FusedProgram& program, const FusedGroup& g,
                                const std::function<bool(size_t input)>& loaded) {
  GroupAccesses out;
  out.sizes = g.sizes.empty() ? std::vector<int64_t>{1} : g.sizes;
  const size_t pad = out.sizes.size() - g.sizes.size();
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const KernelOperand& in = g.inputs[i];
    if (in.literal || (loaded && !loaded(i))) continue;
    std::vector<int64_t> s(pad, 0);
    s.insert(s.end(), in.strides.begin(), in.strides.end());
    out.accesses.push_back({"in" + std::to_string(i), program.meta.at(in.base)->dtype(), in.offset,
                            static_cast<int>(i)});
    out.strides.push_back(std::move(s));
  }
  if (!g.outputs.empty()) out.first_output = static_cast<int>(out.accesses.size());
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    const auto& m = *program.meta.at(g.outputs[i]);
    std::vector<int64_t> s(pad, 0);
    for (int d = 0; d < m.strides_size(); ++d) s.push_back(m.sizes(d) == 1 ? 0 : m.strides(d));
    out.accesses.push_back({"out" + std::to_string(i), m.dtype(), 0, -1});
    out.strides.push_back(std::move(s));
  }
  return out;
}

void EmitElement(const kiln::v1::Graph& graph, const FusedGroup& g, const LocalNames& local,
                 const KernelDialect& dialect, const std::vector<ElementAccess>& accesses,
                 const std::function<std::string(size_t access)>& ref,
                 const std::function<std::optional<std::string>(int node)>& value_of,
                 const std::string& indent, std::ostream& o) {
  std::unordered_map<uint32_t, std::string> var;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (g.inputs[i].literal) var[g.input_ids[i]] = "lit" + std::to_string(i);
  }
  for (size_t a = 0; a < accesses.size(); ++a) {
    if (accesses[a].input < 0) continue;
    const std::string name = "a" + std::to_string(accesses[a].input);
    o << indent << "const " << ComputeType(accesses[a].dtype) << " " << name << " = "
      << dialect.load(accesses[a].dtype, ref(a)) << ";\n";
    var[g.input_ids[accesses[a].input]] = name;
  }
  for (int ni : g.nodes) {
    const auto& node = graph.nodes(ni);
    const auto& out = node.outputs(0);
    const std::string name = local("v", out.id());
    const std::optional<std::string> own = value_of ? value_of(ni) : std::nullopt;
    o << indent << "const " << ComputeType(out.meta().dtype()) << " " << name << " = "
      << (own ? dialect.rounded(out.meta().dtype(), *own)
              : NodeExpression(node, var, dialect.rounded))
      << ";\n";
    var[out.id()] = name;
  }
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    const size_t a = accesses.size() - g.outputs.size() + i;
    o << indent << ref(a) << " = " << dialect.store(accesses[a].dtype, var.at(g.outputs[i]))
      << ";\n";
  }
}

}  // namespace kiln::compiler
