// The ExecutionPlan of a fused program: prologue and per-call steps in order, the metadata of
// every value, kernel outputs as buffers (in a per-call arena where no alias can escape), and
// release lists.
#pragma once

#include <unordered_set>

#include "compiler/passes/fusion.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::compiler {

// With `bound` (the set FuseGraph was given), steps defining bound values form the prologue and
// the bound values per-call steps read are its outputs.
kiln::v1::ExecutionPlan BuildPlan(const kiln::v1::Graph& graph, const FusedProgram& program,
                                  const std::unordered_set<uint32_t>* bound = nullptr);

}  // namespace kiln::compiler
