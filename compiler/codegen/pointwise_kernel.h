// What the CPU and CUDA generators share of a pointwise group's kernel: the accesses it makes
// (inputs loaded per element, then outputs) over its iteration space, and the code of one element
// (loads, the nodes, stores) written through the target's KernelDialect. The targets differ in
// how they walk the space (loops under OpenMP, threads and 16-byte vectors) and index it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "compiler/codegen/distinct_kernels.h"
#include "compiler/codegen/kernel_dialect.h"
#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// A tensor a pointwise kernel reads or writes at every element.
struct ElementAccess {
  std::string ptr;  // the kernel's name for its data: in<i> or out<i>
  kiln::v1::DType dtype;
  int64_t offset;  // of the element at index 0, in elements
  int input;       // index into FusedGroup::inputs; -1 for an output
};

struct GroupAccesses {
  std::vector<int64_t> sizes;  // the group's space ({1} for a scalar's), never empty
  // Every non-literal input the element loads, in input order, then every output.
  std::vector<ElementAccess> accesses;
  std::vector<std::vector<int64_t>> strides;  // per access, over `sizes` (0 where broadcast)
  int first_output = -1;                      // index of the first output; -1 without any
};

// The accesses of pointwise group `g` of `program`; `loaded(i)` (when given) says whether the
// element loads input i (a convolution group's input and weight are read by its window instead).
GroupAccesses PointwiseAccesses(const FusedProgram& program, const FusedGroup& g,
                                const std::function<bool(size_t input)>& loaded = nullptr);

// The code of one element of `g` at `indent`: each access's input into a<i> (a literal input is
// lit<i>), each node's value into its local name (LocalNames' v<k>), rounded as eager stores it,
// then each output stored. `ref(a)` is the element of accesses[a]. `value_of(node)` may give the
// value of a node the target computes itself (the CUDA convolution's window sum), before rounding.
void EmitElement(const kiln::v1::Graph& graph, const FusedGroup& g, const LocalNames& local,
                 const KernelDialect& dialect, const std::vector<ElementAccess>& accesses,
                 const std::function<std::string(size_t access)>& ref,
                 const std::function<std::optional<std::string>(int node)>& value_of,
                 const std::string& indent, std::ostream& o);

}  // namespace kiln::compiler
