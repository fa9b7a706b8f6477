// Window reductions the CUDA generator computes inside a pointwise kernel: a depthwise 2-D
// convolution (one filter per channel, no channel mixing) is, per output element, a sum over a
// small window of its channel's input plane. Generating it keeps its kernels in kilnd's cache
// (cuDNN builds its channels-last depthwise kernels at run time, hundreds of milliseconds per
// shape in every new process) and fuses its epilogue (bias, folded batch norm, activation).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

struct WindowConvolution {
  uint32_t input = 0;   // [N, C, H, W]
  uint32_t weight = 0;  // [C, 1, KH, KW]
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
};

// The depthwise convolution `node` computes when the generator handles it: aten::convolution
// (IsForwardConvolution) on a device of kind DEVICE_KIND_CUDA, without bias (the CUDA pipeline
// moves biases into an epilogue add), a 4-D input of C channels, groups == C, a [C, 1, KH, KW]
// weight, an output of C channels, input, weight and output of one float dtype (f32, bf16, f16),
// and output sizes that agree with the arguments. nullopt otherwise (a library call).
std::optional<WindowConvolution> MatchDepthwiseConvolution(
    const kiln::v1::Node& node,
    const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
    kiln::v1::DeviceKind device);

}  // namespace kiln::compiler
