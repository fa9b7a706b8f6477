// The skeleton of a row-wise group's kernel (FusedGroup::outer_rank >= 0), one for both code
// generators. Per kept row, in group order: each reduction folds its input over the row in one
// pass (two for var and std) that recomputes the full-space nodes it needs; each row node is
// computed once per row; a last pass computes and stores the full-space outputs. A target supplies
// only what differs: how a pass walks the row (loops under OpenMP on the CPU, a block's threads on
// CUDA), how partial results combine, where row values live and what a pass keeps for the next.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/codegen/distinct_kernels.h"
#include "compiler/codegen/kernel_dialect.h"
#include "compiler/codegen/row_group.h"
#include "compiler/ir/fused_program.h"
#include "compiler/ir/reduction_ops.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

class RowKernel {
 public:
  virtual ~RowKernel() = default;

 protected:
  using Vars = std::unordered_map<uint32_t, std::string>;  // value -> the expression naming it

  // `program` fused for `device`; `index` a row-wise group of it. Keeps references to all three.
  RowKernel(const kiln::v1::Graph& graph, const FusedProgram& program, int index,
            kiln::v1::DeviceKind device, const KernelDialect& dialect);

  // Every node's code for the row whose kept indices (i<d>) the target's code before defines, at
  // `indent`: reductions, row nodes and the stores of their values, then the pass that stores the
  // full-space outputs.
  void EmitRows(std::string& indent);

  // Opens a pass over the row's elements (j<d> defined) and computes the full-space values
  // `targets` need; values an earlier pass left behind (held_) are read from there. `clause` is
  // the OpenMP clause of the pass's innermost loop (the CPU's; empty where it accumulates
  // nothing). Returns the variables in scope; ClosePass ends the pass.
  Vars OpenPass(std::string& indent, const std::string& clause,
                const std::vector<uint32_t>& targets);

  // One pass over the row that runs `statement` with x bound to each element of `r`'s input (in
  // compute type `t`).
  void Fold(const Reduction& r, const std::string& t, const std::string& clause,
            const std::string& statement, std::string& indent);

  // Makes `id` (a group input, or a row value already in `vars`) available as a variable.
  void Bind(uint32_t id, const std::string& indent, bool inner, Vars& vars);

  // Writes `id` to its output, when it is one, at the row's (`inner`: the element's) position.
  void StoreIfOutput(uint32_t id, bool inner, const Vars& vars, const std::string& indent,
                     std::ostream& o) const;

  // "<name>[kiln_v]" in a lane kernel (lanes_ > 0), whose row values are arrays over the lanes
  // and whose lane loop (OpenLanes) defines kiln_v; `name` otherwise.
  std::string Lane(const std::string& name) const;

  // --- What a target supplies.
  // Opens the loops of a pass (OpenPass) and declares what it will keep for later passes.
  virtual void OpenPassLoops(std::string& indent, const std::string& clause,
                             const std::vector<uint32_t>& targets) = 0;
  virtual void ClosePass(std::string& indent) = 0;
  // After a pass defined full-space value `id` as `name`; after all its values (`vars`).
  virtual void Computed(uint32_t /*id*/, const std::string& /*name*/,
                        const std::string& /*indent*/) {}
  virtual void EndPass(const Vars& /*vars*/, const std::string& /*indent*/) {}
  // A lane kernel's loop over its rows, around code that computes row values.
  virtual void OpenLanes(std::string& /*indent*/) {}
  virtual void CloseLanes(std::string& /*indent*/) {}
  // The condition (an opening "if (...) {") under which one thread stores a row's values; empty
  // when the code runs once per row.
  virtual std::string RowStoreGuard() const { return ""; }
  // Defines row value `name` of type `t` as `value`; returns the expression naming it.
  virtual std::string DefineRow(const std::string& t, const std::string& name,
                                const std::string& value, std::string& indent) = 0;
  // Accumulator `acc` (0, then `statement(acc)` per element) summed over the row; returns the
  // expression of the row's sum.
  virtual std::string SumOverRow(const Reduction& r, const std::string& t, const std::string& acc,
                                 const std::function<std::string(const std::string&)>& statement,
                                 std::string& indent) = 0;
  // The row's maximum (`max`) or minimum into accumulator `acc`, NaN when any element is NaN;
  // `k` numbers the reduction's other names. Returns the expression of the result.
  virtual std::string ExtremumOverRow(const Reduction& r, const std::string& t, bool max,
                                      const std::string& acc, const std::string& k,
                                      std::string& indent) = 0;

  const kiln::v1::Graph& graph_;
  const FusedProgram& program_;
  const FusedGroup& g_;
  const int index_;
  const LocalNames local_;
  const KernelDialect dialect_;
  const int rank_, outer_;
  const int64_t length_;  // elements of a row
  const RowGroup rows_;
  int lanes_ = 0;  // > 0: a lane kernel, rows computed lanes_ at a time (the CPU's)
  Vars rows_var_;  // row values and row-context loads in scope
  Vars held_;      // full-space values an earlier pass left for later ones, per element
  std::ostringstream body_;

 private:
  void EmitReduction(const kiln::v1::Node& node, const Reduction& r, std::string& indent);
  void EmitRowNode(const kiln::v1::Node& node, std::string& indent);
};

}  // namespace kiln::compiler
