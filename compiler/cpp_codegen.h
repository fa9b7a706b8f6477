// C++ source for fused kernel groups: one extern "C" function per group with the iteration space,
// strides and offsets as compile-time constants, OpenMP across outer loops.
#pragma once

#include <string>

#include "compiler/fusion.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// The symbol of group `index`.
std::string KernelSymbol(int index);

// The whole translation unit: a prelude (bf16 conversions) and every group of `program` that a
// step launches. Kernel parameters: the group's inputs (bases, in input order), then its outputs.
std::string GenerateCpp(const kiln::v1::Graph& graph, const FusedProgram& program);

}  // namespace kiln::compiler
