#include "compiler/ir/fused_program.h"

namespace kiln::compiler {

std::string KernelSymbol(int index) { return "kiln_kernel_" + std::to_string(index); }

std::vector<int64_t> RowShape(const FusedGroup& group) {
  std::vector<int64_t> shape(group.sizes.begin(), group.sizes.begin() + group.outer_rank);
  shape.resize(group.sizes.size(), 1);
  return shape;
}

}  // namespace kiln::compiler
