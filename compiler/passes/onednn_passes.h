// Library-op selection for clients whose torch has oneDNN (Target.cpu_onednn): matrix products
// and convolutions become mkldnn:: calls, with weights prepacked once in the plan's prologue
// where they are bound values, and a convolution's relu and residual add run as its post-ops.
#pragma once

#include "compiler/passes/graph_passes.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// A float32 aten::mm(x, y) becomes mkldnn::_linear_pointwise(x, y^T), oneDNN's GEMM (about 1.3x
// ATen's mm on the shapes of linear layers). y^T is the tensor y is a transpose of (a linear's
// weight) or a new permute of y. When y is a bound value (a parameter, stored either way round:
// GPT-2's Conv1D keeps [in, out]), the GEMM takes mkldnn::_reorder_linear_weight(y^T, M)
// instead: packed once, not reordered every call.
// Run dead-code elimination afterwards: the transposes it bypassed may be unused.
kiln::v1::Graph UseOneDnnLinear(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// A float32 2-D aten::convolution (not transposed) whose weight is a bound value becomes
// mkldnn::_convolution_pointwise over mkldnn::_reorder_convolution_weight(weight, ..., input
// size): the weight is packed for this input once. When the convolution's only reader is a
// relu, hardswish, silu, sigmoid, tanh, hardsigmoid or integral hardtanh (ReLU6), it becomes the
// convolution's post-op; when it is an add of a tensor of its shape (a
// residual, in any layout), mkldnn::_convolution_pointwise.binary adds it, with the add's relu
// reader as the unary post-op. The fused node defines the last value it replaces. A weight made
// by a pointwise node (the conv-BN fold) that only this convolution reads is stored
// channels-last, the layout the reorder packs from without a copy.
kiln::v1::Graph UseOneDnnConvolution(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// A bias add after a oneDNN linear (mkldnn::_linear_pointwise with no bias and no post-op),
// optionally through a row-major reshape of its result (a linear over [B, T, K] is a GEMM over
// [B*T, K] viewed back), becomes the linear's bias, and a relu of the sum its post-op: oneDNN
// applies them to the product's tiles while they are in registers instead of a kernel reading
// the whole product again. The bias must be a bound float32 value of sizes [N], the product's
// columns; every intermediate must have the one reader the rewrite absorbs. The last absorbed
// value is then the (viewed) result of the new linear.
kiln::v1::Graph FuseLinearEpilogues(const kiln::v1::Graph& graph, PassStats* stats = nullptr);

// A mkldnn::_convolution_pointwise.binary whose residual `other` nobody needs afterwards
// becomes mkldnn::_convolution_pointwise_.binary, which accumulates the convolution into
// `other`'s memory (oneDNN's sum post-op) instead of writing a new tensor: torch 2.11's
// out-of-place op copies the residual into its result first (about 10% of resnet50's time at 16
// threads). Only where overwriting is certainly invisible: `other` is made by a node of the graph
// (no input, constant or bound value) that is not a view, is channels-last dense with the result's
// layout, is no graph output and no view's input, and every other node reading it is an ancestor
// of the convolution (so any order the later passes choose runs it first).
kiln::v1::Graph AccumulateResidualsInPlace(const kiln::v1::Graph& graph,
                                           PassStats* stats = nullptr);

}  // namespace kiln::compiler
