// Library-op selection for CUDA targets: which ATen call does the work a decomposed graph spells
// out in several nodes, where the library does it better than a generated kernel would.
#pragma once

#include "compiler/passes/graph_passes.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// aten::mm(x, w) whose only reader adds a bias (optionally through a row-major reshape of the
// product that keeps its last dimension: a linear over [B, T, K] is a GEMM over [B*T, K] viewed
// back), when that sum is a graph output no node reads (a classifier's last linear), becomes
// aten::addmm(bias, x, w), as eager runs a linear layer: ATen gives a 1-D bias to cuBLASLt's
// bias epilogue, which adds it to the product in float before the one rounding to the result's
// dtype. That saves the kernel the add would be alone, and a process's first call runs the GEMM
// kernel eager's linears loaded instead of loading cuBLAS's plain one (45 ms for float32 on an
// H200). Where a node reads the sum, the add stays a node: it fuses into that node's kernel,
// and cuBLASLt's float32 GEMMs with a bias ran slower than cuBLAS's plain ones (BERT-base 6.4
// against 5.4 ms, an H200). The bias must have the product's dtype and sizes [N] (its columns)
// and be dense; the sum must keep the product's layout. The addmm defines the sum (or the
// product it is a view of, viewed back), placed where the sum was.
kiln::v1::Graph LinearBiasAsGemmEpilogue(const kiln::v1::Graph& graph,
                                         PassStats* stats = nullptr);

}  // namespace kiln::compiler
