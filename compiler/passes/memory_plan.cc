// Buffer lifetimes over the step order, first-fit arena offsets (64-byte aligned), and the
// step after which each allocator-owned value may be dropped.
#include "compiler/passes/memory_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ir/ir_validator.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/passes/bound_prologue.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;

// Bytes from the start of the buffer's storage to the end of its last element, as the runtime
// lays it out in the arena (storage offset included).
int64_t SpanBytes(const kiln::v1::TensorMeta& m) {
  int64_t last = m.storage_offset();
  for (int d = 0; d < m.sizes_size(); ++d) {
    if (m.sizes(d) == 0) return m.storage_offset() * ElementSize(m.dtype());
    last += (m.sizes(d) - 1) * m.strides(d);
  }
  return (last + 1) * ElementSize(m.dtype());
}

int64_t Align64(int64_t n) { return (n + 63) / 64 * 64; }

}  // namespace

kiln::v1::ExecutionPlan BuildPlan(const kiln::v1::Graph& graph, const FusedProgram& program,
                                  const std::unordered_set<uint32_t>* bound) {
  kiln::v1::ExecutionPlan plan;
  // Each fused step goes to the prologue (it defines bound values) or to the per-call steps;
  // positions below are within its own list.
  struct Placement {
    bool prologue = false;
    int position = 0;
  };
  std::vector<Placement> where(program.steps.size());
  std::vector<std::vector<uint32_t>> step_reads(program.steps.size());
  std::unordered_map<uint32_t, int> def_step;  // value -> fused step defining it
  std::unordered_set<uint32_t> viewed;         // values a view op reads: never in the arena
  std::unordered_map<std::string, const std::string*> schemas;  // declared, by op
  for (const kiln::v1::OpSchema& schema : graph.schemas()) schemas[schema.op()] = &schema.schema();
  for (size_t s = 0; s < program.steps.size(); ++s) {
    const FusedStep& step = program.steps[s];
    const kiln::v1::Node& first =
        graph.nodes(step.is_kernel ? program.groups[step.group].nodes.front() : step.node);
    where[s].prologue = bound != nullptr && IsBoundNode(first, *bound);
    auto* list = where[s].prologue ? plan.mutable_prologue() : plan.mutable_steps();
    where[s].position = list->size();
    kiln::v1::PlanStep* ps = list->Add();
    if (step.is_kernel) {
      const FusedGroup& g = program.groups[step.group];
      kiln::v1::KernelLaunch* k = ps->mutable_kernel();
      k->set_symbol(KernelSymbol(step.group));
      for (const KernelOperand& in : g.inputs) {
        if (in.literal) continue;  // folded into the code
        k->add_args(in.base);
        step_reads[s].push_back(in.base);
      }
      if (g.runtime_outer) *k->add_size_args() = *g.runtime_outer;
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
      // The runtime calls the op only if its dispatcher has the schema the daemon admitted.
      if (auto declared = schemas.find(n.op()); declared != schemas.end()) {
        call->set_schema(*declared->second);
      }
      step_reads[s] = ValuesRead(n);
      if (MayAliasInput(n.op())) viewed.insert(step_reads[s].begin(), step_reads[s].end());
      // The result is the first input's memory, alive after the input's last use.
      if (WritesFirstInput(n.op()) && !step_reads[s].empty()) viewed.insert(step_reads[s][0]);
      for (const auto& out : n.outputs()) {
        call->add_outputs(out.id());
        def_step[out.id()] = static_cast<int>(s);
      }
    }
  }
  auto step_at = [&](int s) {
    return where[s].prologue ? plan.mutable_prologue(where[s].position)
                             : plan.mutable_steps(where[s].position);
  };
  for (const auto& v : graph.inputs()) plan.add_inputs(v.id());
  *plan.mutable_outputs() = graph.outputs();
  std::unordered_set<uint32_t> outputs(graph.outputs().begin(), graph.outputs().end());
  std::unordered_set<uint32_t> read;
  for (const auto& ids : step_reads) read.insert(ids.begin(), ids.end());
  for (const auto& c : graph.constants()) {
    // A constant only kernels used as a literal, or nobody used, is not shipped.
    if (read.count(c.value().id()) || outputs.count(c.value().id())) *plan.add_constants() = c;
  }

  // Last use of every value; prologue values that per-call steps read are kept between calls.
  std::unordered_map<uint32_t, int> last_use;
  std::set<uint32_t> kept;
  for (size_t s = 0; s < step_reads.size(); ++s) {
    for (uint32_t id : step_reads[s]) {
      auto d = def_step.find(id);
      if (d != def_step.end() && where[d->second].prologue && !where[s].prologue) {
        kept.insert(id);
      }
      last_use[id] = static_cast<int>(s);
    }
  }
  for (uint32_t id : kept) plan.add_prologue_outputs(id);
  for (auto& [id, s] : def_step) {
    if (!last_use.count(id)) last_use[id] = s;
  }

  // Metadata of every value the plan names (inputs even when unused), in id order.
  std::map<uint32_t, const kiln::v1::TensorMeta*> named;
  for (const auto& [id, meta] : program.meta) {
    if (def_step.count(id) || last_use.count(id) || outputs.count(id)) named[id] = meta;
  }
  for (const auto& v : graph.inputs()) named[v.id()] = &v.meta();
  for (const auto& c : plan.constants()) named[c.value().id()] = &c.value().meta();
  for (const auto& [id, meta] : named) {
    auto* v = plan.add_values();
    v->set_id(id);
    *v->mutable_meta() = *meta;
  }

  // Buffers and the arena: each per-call buffer goes at the lowest 64-byte aligned offset where
  // it overlaps no buffer placed before it whose lifetime (first write .. last read, in steps)
  // overlaps its own. Prologue buffers outlive the call: never in the arena.
  struct Placed {
    int64_t offset, size;
    int first, last;
  };
  std::vector<Placed> placed;
  int64_t arena = 0;
  std::unordered_set<uint32_t> in_arena;
  for (size_t s = 0; s < program.steps.size(); ++s) {
    if (!program.steps[s].is_kernel) continue;
    for (uint32_t id : program.groups[program.steps[s].group].outputs) {
      auto* b = plan.add_buffers();
      b->set_id(id);
      // A buffer whose sizes are the call's is allocated per call, as the caller's tensors are.
      if (outputs.count(id) || viewed.count(id) || where[s].prologue ||
          IsSymbolic(*program.meta.at(id))) {
        continue;
      }
      const int64_t size = Align64(std::max<int64_t>(SpanBytes(*program.meta.at(id)), 1));
      const int first = static_cast<int>(s), last = last_use[id];
      std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of live-together buffers
      for (const Placed& p : placed) {
        if (p.first <= last && first <= p.last) busy.emplace_back(p.offset, p.offset + p.size);
      }
      std::sort(busy.begin(), busy.end());
      int64_t offset = 0;
      for (const auto& [begin, end] : busy) {
        if (offset + size <= begin) break;
        offset = std::max(offset, end);
      }
      placed.push_back({offset, size, first, last});
      arena = std::max(arena, offset + size);
      b->set_in_arena(true);
      b->set_arena_offset(static_cast<uint64_t>(offset));
      in_arena.insert(id);
    }
  }
  plan.set_arena_bytes(static_cast<uint64_t>(arena));

  // Release: values the plan itself made (library results, buffers outside the arena), after
  // their last use in the list that made them.
  for (const auto& [id, s] : std::map<uint32_t, int>(def_step.begin(), def_step.end())) {
    if (outputs.count(id) || in_arena.count(id) || kept.count(id)) continue;
    step_at(last_use[id])->add_release(id);
  }
  return plan;
}

}  // namespace kiln::compiler
