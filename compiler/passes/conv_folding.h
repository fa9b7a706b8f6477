// Inference folding of a per-channel affine epilogue (an eval-mode batch norm: (y - mean) *
// rsqrt(var + eps) * gamma + beta, or any chain of such adds, subtractions and products) into
// the convolution that feeds it: conv(x, w, b) * s + t = conv(x, w * s, b * s + t).
#pragma once

#include "compiler/passes/graph_passes.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// Rewrites each aten::_native_batch_norm_legit_no_training (batch norm with running statistics,
// as the client traces it: one node instead of a dozen traced ops) whose statistics outputs
// nobody reads into ((x - mean) * rsqrt(var + eps)) * weight + bias over the statistics viewed
// per channel ([1, C, 1, ...]), in float32 for bfloat16/float16 inputs and cast back, as ATen's
// kernels compute it: the chain FoldConvolutionAffine folds into a preceding convolution, and
// otherwise one pointwise kernel. The last node defines the batch norm's result, with its id
// and metadata; intermediate values take its sizes and strides.
kiln::v1::Graph DecomposeBatchNormEval(const kiln::v1::Graph& graph);

// Rewrites aten::convolution (2-D, not transposed, float32) whose result only a chain of
// single-reader aten::add/sub/mul.Tensor nodes reads, each with a per-output-channel operand
// computed from bound inputs and constants (BoundValues), into a convolution with a new weight
// and bias computed from those operands (bound values too: the plan's prologue computes them).
// The new convolution defines the chain's last value, with its id and metadata; the chain and
// the old convolution die. Results change only by float rounding.
kiln::v1::Graph FoldConvolutionAffine(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// Rewrites aten::convolution with a bias value (of the result's dtype, one per output channel)
// into the convolution without it and an aten::add.Tensor of the bias viewed as [1, C, 1, ...],
// which defines the old result. ATen's CUDA convolutions add a bias in a separate pass over the
// result (`output.add_(bias)`); as a pointwise node it fuses into the kernel of what reads the
// result (the ReLU or residual add a folded batch norm leaves), as it does when no norm was
// folded. The same additions in the same dtype: results do not change.
kiln::v1::Graph ConvolutionBiasAsEpilogue(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// Gives each depthwise convolution the CUDA generator computes (MatchDepthwiseConvolution) whose
// weight is a bound value (a parameter, or computed from parameters) a copy of that weight with
// the channels innermost ([KH, KW, C] in memory, viewed back as [C, 1, KH, KW]): the threads of
// a warp, one channel each, then read one tap's weights from consecutive addresses instead of
// KH * KW elements apart. The copy is bound too: the plan's prologue makes it once.
kiln::v1::Graph DepthwiseWeightsChannelsInnermost(const kiln::v1::Graph& graph);

}  // namespace kiln::compiler
