// Inference folding of a per-channel affine epilogue (an eval-mode batch norm: (y - mean) *
// rsqrt(var + eps) * gamma + beta, or any chain of such adds, subtractions and products) into
// the convolution that feeds it: conv(x, w, b) * s + t = conv(x, w * s, b * s + t).
#pragma once

#include "compiler/passes/graph_passes.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// Rewrites aten::convolution (2-D, not transposed, float32) whose result only a chain of
// single-reader aten::add/sub/mul.Tensor nodes reads, each with a per-output-channel operand
// computed from bound inputs and constants (BoundValues), into a convolution with a new weight
// and bias computed from those operands (bound values too: the plan's prologue computes them).
// The new convolution defines the chain's last value, with its id and metadata; the chain and
// the old convolution die. Results change only by float rounding.
kiln::v1::Graph FoldConvolutionAffine(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

}  // namespace kiln::compiler
