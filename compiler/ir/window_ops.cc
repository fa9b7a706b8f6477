#include "compiler/ir/window_ops.h"

#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;

// A 2-D int[] argument (one value stands for both dims); false for anything else.
bool Pair(const Argument& a, int64_t out[2]) {
  if (a.kind_case() != Argument::kIntList) return false;
  const auto& v = a.int_list().values();
  if (v.size() == 1) {
    out[0] = out[1] = v[0];
    return true;
  }
  if (v.size() != 2) return false;
  out[0] = v[0];
  out[1] = v[1];
  return true;
}

}  // namespace

std::optional<WindowConvolution> MatchDepthwiseConvolution(
    const kiln::v1::Node& node,
    const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
    kiln::v1::DeviceKind device) {
  if (device != kiln::v1::DEVICE_KIND_CUDA || !IsForwardConvolution(node) ||
      node.args(2).kind_case() != Argument::kNone) {
    return std::nullopt;
  }
  WindowConvolution c;
  c.input = node.args(0).value();
  c.weight = node.args(1).value();
  auto x_it = meta.find(c.input), w_it = meta.find(c.weight);
  if (x_it == meta.end() || w_it == meta.end()) return std::nullopt;
  const kiln::v1::TensorMeta &x = *x_it->second, &w = *w_it->second;
  const kiln::v1::TensorMeta& y = node.outputs(0).meta();
  if (x.sizes_size() != 4 || w.sizes_size() != 4 || y.sizes_size() != 4) return std::nullopt;
  const int64_t channels = x.sizes(1);
  if (channels < 1 || node.args(8).int_value() != channels || w.sizes(0) != channels ||
      w.sizes(1) != 1 || y.sizes(1) != channels || y.sizes(0) != x.sizes(0)) {
    return std::nullopt;
  }
  if (!IsFloatingDType(y.dtype()) || y.dtype() == kiln::v1::DTYPE_FLOAT64 ||
      x.dtype() != y.dtype() || w.dtype() != y.dtype()) {
    return std::nullopt;
  }
  for (const kiln::v1::TensorMeta* m : {&x, &w, &y}) {
    if (m->device().kind() != device || m->device().index() != y.device().index()) {
      return std::nullopt;
    }
  }
  if (!Pair(node.args(3), c.stride) || !Pair(node.args(4), c.padding) ||
      !Pair(node.args(5), c.dilation)) {
    return std::nullopt;
  }
  for (int d = 0; d < 2; ++d) {
    c.kernel[d] = w.sizes(2 + d);
    if (c.kernel[d] < 1 || c.stride[d] < 1 || c.padding[d] < 0 || c.dilation[d] < 1) {
      return std::nullopt;
    }
    const int64_t span = c.dilation[d] * (c.kernel[d] - 1) + 1;
    const int64_t padded = x.sizes(2 + d) + 2 * c.padding[d];
    if (padded < span || y.sizes(2 + d) != (padded - span) / c.stride[d] + 1) return std::nullopt;
  }
  return c;
}

}  // namespace kiln::compiler
