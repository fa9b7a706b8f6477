// What both code generators ask of a row-wise group (FusedGroup::outer_rank >= 0): which of its
// nodes are reductions, row nodes (over the kept rows) or full nodes (over the whole space), who
// produces a value, which input holds it, and the offset of an element at the loop indices.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/ir/fused_program.h"
#include "compiler/ir/reduction_ops.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

class RowGroup {
 public:
  // `program` fused for `device`; `index` a row-wise group of it. Keeps references to all three.
  RowGroup(const kiln::v1::Graph& graph, const FusedProgram& program, int index,
           kiln::v1::DeviceKind device);

  const FusedGroup& group() const { return g_; }
  int rank() const { return static_cast<int>(g_.sizes.size()); }
  int outer() const { return g_.outer_rank; }

  std::optional<Reduction> ReductionOf(const kiln::v1::Node& node) const;
  // A pointwise node over the kept rows (its output has RowShape).
  bool IsRowNode(const kiln::v1::Node& node) const;
  // A value computed by a pointwise node of the group over the whole space.
  bool IsFullNode(uint32_t id) const;
  // The group's node defining `id` (index into Graph.nodes); -1 for a value from outside.
  int Producer(uint32_t id) const;
  // The index into group().inputs of `id`; -1 when it is not a group input.
  int InputOf(uint32_t id) const;

  // The element offset `offset` + sum of index * stride over the kept dims (named i<d>) and, with
  // `inner`, the reduced ones (j<d>); dims of size 1 or stride 0 are left out.
  std::string Index(int64_t offset, const std::vector<int64_t>& strides, bool inner) const;

  // Makes `id` a variable of the kernel when it is a group input not yet in `vars`: a one-element
  // constant is its literal (lit<i>); any other input is loaded (`load(dtype, "in<i>[index]")`,
  // the generator's load expression in the compute type) into a const (a<i> inside the reduced
  // dims, ra<i> over the rows), written to `out` at `indent`. In-group values are left to the
  // caller.
  using LoadFn = std::string (*)(kiln::v1::DType dtype, const std::string& ref);
  void BindInput(uint32_t id, bool inner, LoadFn load, const std::string& indent, std::ostream& out,
                 std::unordered_map<uint32_t, std::string>& vars) const;

 private:
  const kiln::v1::Graph& graph_;
  const FusedProgram& program_;
  const FusedGroup& g_;
  const kiln::v1::DeviceKind device_;
  std::unordered_map<uint32_t, int> producer_;  // value -> node index, for the group's nodes
  std::unordered_map<uint32_t, int> input_of_;  // value -> index into g_.inputs
};

}  // namespace kiln::compiler
