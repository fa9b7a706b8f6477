// C++ source for fused kernel groups: one extern "C" function per group with the iteration space,
// strides and offsets as compile-time constants, OpenMP across outer loops.
#pragma once

#include <map>
#include <string>

#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// The whole translation unit: a prelude (headers, glibc's vector math, the text of
// kiln/v1/kernel_abi.h, bf16 conversions) and every group of `program` that a step launches, each
// exported as KernelSymbol(group) with the ABI's kiln_kernel_fn signature. Kernel parameters: the
// group's inputs (bases, in input order), then its outputs. Needs no header beyond the C++
// standard library's. A group whose kernel is the same code as an earlier group's exports nothing:
// its steps call the earlier function (DistinctKernels).
struct CppSource {
  std::string source;
  std::map<std::string, std::string> functions;  // KernelSymbol(group) -> the function to call
};
CppSource GenerateCpp(const kiln::v1::Graph& graph, const FusedProgram& program);

}  // namespace kiln::compiler
