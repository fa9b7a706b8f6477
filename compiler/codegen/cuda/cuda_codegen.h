// CUDA C++ source for fused kernel groups (the same FusedProgram the CPU generator reads): one
// extern "C" __global__ function per group with sizes, strides and offsets compiled in, and the
// launch configuration chosen for it from those sizes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// How one kernel is launched (KernelLaunch's grid, block and shared_memory_bytes).
struct CudaLaunch {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_memory_bytes = 0;  // dynamic; the kernels' shared memory is static
  // A kernel with a runtime outer extent (FusedGroup::runtime_outer): grid[0] per call, the work
  // (elements, rows) over grid_work_per_block, clamped to [1, grid_max] (KernelLaunch's fields).
  std::optional<kiln::v1::SymExpr> grid_work;
  uint32_t grid_work_per_block = 0;
  uint32_t grid_max = 0;
  // The __global__ function the step launches: its own KernelSymbol, or that of an earlier group
  // whose kernel is the same code (one transformer layer's kernels are every layer's).
  std::string function;
};

struct CudaSource {
  std::string source;
  std::map<std::string, CudaLaunch> launches;  // by KernelSymbol
};

// The whole translation unit for NVRTC (self-contained: it includes no header) and the launch of
// every group of `program` (fused for DEVICE_KIND_CUDA) that a step launches. Each kernel is
//   extern "C" __global__ void <KernelSymbol(group)>(const T* in.., T* out..)
// with one pointer per non-literal input (in input order), then one per output: the CUDA kernel
// ABI of kiln.v1 (artifact.proto, KernelLaunch). Any grid the launch names covers the iteration
// space (kernels loop with a grid stride); every block size is a multiple of 32. A group whose
// kernel would be the same code as an earlier group's (same sizes, strides, offsets, dtypes and
// nodes) gets no function of its own: its launch names the earlier one (CudaLaunch::function), so
// NVRTC builds each distinct kernel once.
//
// Pointwise groups: one thread per element, or per 16 bytes of the widest operand when the space
// collapses to one dim that every access walks contiguously (or broadcasts) at a 16-byte aligned
// offset; that vector path runs only when every pointer is 16-byte aligned at run time (a uniform
// branch), the scalar path otherwise. Row-wise groups (outer_rank >= 0): one block per row
// (grid-stride over rows), threads strided over the row, warp shuffles then shared memory for the
// block's reductions (float accumulation; var/std in two passes), the block size from the row's
// length (long rows loop with a block stride). A row of at most 8 elements per thread is walked by
// an unrolled loop, and what each pass reduces stays in registers for the later passes, so the row
// is read and its prologue computed once. Depthwise convolution groups (convolution >= 0): one
// thread per output element, or per 16 bytes of channels when channels-last, summing the window.
CudaSource GenerateCudaKernels(const kiln::v1::Graph& graph, const FusedProgram& program);

}  // namespace kiln::compiler
