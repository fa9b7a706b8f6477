// Buffer lifetimes over the step order, first-fit arena offsets (64-byte aligned), and the
// step after which each allocator-owned value may be dropped.
#include "compiler/memory_plan.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "compiler/cpp_codegen.h"
#include "compiler/ir_validator.h"
#include "compiler/pointwise_ops.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;

int64_t SpanBytes(const kiln::v1::TensorMeta& m) {
  int64_t last = 0;
  for (int d = 0; d < m.sizes_size(); ++d) {
    if (m.sizes(d) == 0) return 0;
    last += (m.sizes(d) - 1) * m.strides(d);
  }
  return (last + 1) * ElementSize(m.dtype());
}

int64_t Align64(int64_t n) { return (n + 63) / 64 * 64; }

}  // namespace

kiln::v1::ExecutionPlan BuildPlan(const kiln::v1::Graph& graph, const FusedProgram& program) {
  kiln::v1::ExecutionPlan plan;
  std::unordered_set<uint32_t> used;
  std::vector<std::vector<uint32_t>> step_reads(program.steps.size());
  std::unordered_map<uint32_t, int> def_step;
  std::unordered_set<uint32_t> viewed;  // values a view op reads: never in the arena
  for (size_t s = 0; s < program.steps.size(); ++s) {
    const FusedStep& step = program.steps[s];
    kiln::v1::PlanStep* ps = plan.add_steps();
    if (step.is_kernel) {
      const FusedGroup& g = program.groups[step.group];
      kiln::v1::KernelLaunch* k = ps->mutable_kernel();
      k->set_symbol(KernelSymbol(step.group));
      for (const KernelOperand& in : g.inputs) {
        k->add_args(in.base);
        step_reads[s].push_back(in.base);
      }
      for (uint32_t id : g.outputs) {
        k->add_args(id);
        k->add_writes(id);
        def_step[id] = static_cast<int>(s);
      }
    } else {
      const kiln::v1::Node& n = graph.nodes(step.node);
      kiln::v1::LibraryCall* call = ps->mutable_library();
      call->set_op(n.op());
      *call->mutable_args() = n.args();
      for (const Argument& a : n.args()) {
        if (a.kind_case() == Argument::kValue) step_reads[s].push_back(a.value());
        if (a.kind_case() == Argument::kValueList) {
          for (uint32_t id : a.value_list().ids()) step_reads[s].push_back(id);
        }
      }
      if (IsViewOp(n.op())) viewed.insert(step_reads[s].begin(), step_reads[s].end());
      for (const auto& out : n.outputs()) {
        call->add_outputs(out.id());
        def_step[out.id()] = static_cast<int>(s);
      }
    }
  }
  for (const auto& v : graph.inputs()) plan.add_inputs(v.id());
  *plan.mutable_constants() = graph.constants();
  *plan.mutable_outputs() = graph.outputs();
  std::unordered_set<uint32_t> outputs(graph.outputs().begin(), graph.outputs().end());

  // Last use of every value.
  std::unordered_map<uint32_t, int> last_use;
  for (size_t s = 0; s < step_reads.size(); ++s) {
    for (uint32_t id : step_reads[s]) last_use[id] = static_cast<int>(s);
  }
  for (auto& [id, s] : def_step) {
    if (!last_use.count(id)) last_use[id] = s;
  }

  // Metadata of every value the plan names.
  for (const auto& [id, meta] : program.meta) {
    bool named = def_step.count(id) || last_use.count(id) || outputs.count(id);
    if (!named) continue;
    auto* v = plan.add_values();
    v->set_id(id);
    *v->mutable_meta() = *meta;
  }
  for (const auto& v : graph.inputs()) {
    if (!def_step.count(v.id()) && !last_use.count(v.id()) && !outputs.count(v.id())) {
      *plan.add_values() = v;  // unused inputs still have metadata
    }
  }

  // Buffers and the arena: first fit among buffers whose lifetimes overlap.
  struct Placed { int64_t offset, size; int first, last; };
  std::vector<Placed> placed;
  int64_t arena = 0;
  std::unordered_set<uint32_t> in_arena;
  for (size_t s = 0; s < program.steps.size(); ++s) {
    if (!program.steps[s].is_kernel) continue;
    for (uint32_t id : program.groups[program.steps[s].group].outputs) {
      auto* b = plan.add_buffers();
      b->set_id(id);
      if (outputs.count(id) || viewed.count(id)) continue;
      const int64_t size = Align64(std::max<int64_t>(SpanBytes(*program.meta.at(id)), 1));
      const int first = static_cast<int>(s), last = last_use[id];
      int64_t offset = 0;
      for (bool moved = true; moved;) {
        moved = false;
        for (const Placed& p : placed) {
          bool live_together = !(p.last < first || last < p.first);
          bool overlap = offset < p.offset + p.size && p.offset < offset + size;
          if (live_together && overlap) {
            offset = p.offset + p.size;
            moved = true;
          }
        }
      }
      placed.push_back({offset, size, first, last});
      arena = std::max(arena, offset + size);
      b->set_in_arena(true);
      b->set_arena_offset(static_cast<uint64_t>(offset));
      in_arena.insert(id);
    }
  }
  plan.set_arena_bytes(static_cast<uint64_t>(arena));

  // Release: values the plan itself made (library results, buffers outside the arena).
  for (const auto& [id, s] : def_step) {
    if (outputs.count(id) || in_arena.count(id)) continue;
    plan.mutable_steps(last_use[id])->add_release(id);
  }
  return plan;
}

}  // namespace kiln::compiler
