// Graph-to-graph rewrites run before fusion: dead-code elimination, common-subexpression
// elimination and view simplification. Each keeps value ids and the graph's inputs and outputs.
#pragma once

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

struct PassStats {
  int dead_nodes = 0;           // nodes removed because nothing reads their outputs
  int dead_constants = 0;       // constants nothing reads
  int common_nodes = 0;         // nodes replaced by an identical earlier node
  int identity_nodes = 0;       // views and copies whose result equals their input
  int folded_views = 0;         // view(view(x)) rewritten to view(x)
  int onednn_linears = 0;       // aten::mm calls given to oneDNN
  int hoisted_views = 0;        // reshapes moved above the pointwise node that fed them
  int folded_convolutions = 0;  // per-channel affine epilogues folded into a convolution
  int convolution_bias_epilogues = 0;  // convolution biases added by the reader's kernel
  int gemm_bias_epilogues = 0;  // linear biases added by the CUDA GEMM (aten::addmm)
  int onednn_convolutions = 0;  // convolutions given to oneDNN with a prepacked weight
  int channels_last_weights = 0;  // folded convolution weights written channels-last to pack
  int linear_biases = 0;        // bias adds run by oneDNN linears
  int inplace_residuals = 0;    // residual adds accumulated into the residual's own memory
  int fused_post_ops = 0;       // relus and residual adds run by oneDNN as post-ops
  int packed_linears = 0;       // oneDNN GEMMs with a prepacked weight
};

// Removes nodes none of whose outputs is read by a live node or returned, and unread constants.
kiln::v1::Graph EliminateDeadCode(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// Replaces a node by an earlier one with the same op, arguments and output metadata. A node that
// defines a graph output stays, and so does a copy a graph output is a view of, so that outputs
// never become aliases of one another.
kiln::v1::Graph EliminateCommonSubexpressions(const kiln::v1::Graph& graph,
                                              PassStats* stats = nullptr);

// Drops views and copies whose output metadata equals their input's (view to the same sizes of a
// contiguous tensor, identity permute, clone of a tensor already in that layout, x * 1, x / 1,
// x - 0), and reads
// view(view(x)) of a row-major x as view(x). Graph outputs are never replaced, nor copies that
// a graph output is a view of.
kiln::v1::Graph SimplifyViews(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// Moves a row-major reshape above the pointwise node whose only reader it is:
// view(add(mm, bias), [B, T, N]) becomes add(view(mm, [B, T, N]), bias) when the other operands
// broadcast to the new shape exactly as to the old (only the reshape's trailing dims, which
// both shapes share). A linear's bias add then has the shape of what follows it (GELU, residual
// add, layer norm) and fuses with it. Reshapes that only library calls read stay. The reshape
// keeps its value id; the pointwise node dies.
kiln::v1::Graph HoistViewsAbovePointwise(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

class PassLog;

// All of the above: view simplification, view hoisting, CSE, then DCE. With a `log`, records the
// graph after each of them.
kiln::v1::Graph RunGraphPasses(const kiln::v1::Graph& graph, PassStats* stats = nullptr,
                               PassLog* log = nullptr);

}  // namespace kiln::compiler
