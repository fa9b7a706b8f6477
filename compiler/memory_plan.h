// The ExecutionPlan of a fused program: steps in order, the metadata of every value, kernel
// outputs as buffers (in a per-call arena where no alias can escape), and release lists.
#pragma once

#include "compiler/fusion.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::compiler {

kiln::v1::ExecutionPlan BuildPlan(const kiln::v1::Graph& graph, const FusedProgram& program);

}  // namespace kiln::compiler
