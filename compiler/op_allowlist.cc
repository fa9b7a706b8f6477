// The default op allowlist: ATen schema names (namespace::name.overload).
#include "compiler/op_allowlist.h"

namespace kiln::compiler {
namespace {

constexpr const char* kDefaultOps[] = {
    // Pointwise arithmetic.
    "aten::add.Tensor",
    "aten::add.Scalar",
    "aten::sub.Tensor",
    "aten::sub.Scalar",
    "aten::mul.Tensor",
    "aten::mul.Scalar",
    "aten::div.Tensor",
    "aten::div.Scalar",
    "aten::div.Tensor_mode",
    "aten::neg",
    "aten::abs",
    "aten::pow.Tensor_Scalar",
    "aten::pow.Tensor_Tensor",
    "aten::sqrt",
    "aten::rsqrt",
    "aten::reciprocal",
    "aten::exp",
    "aten::log",
    "aten::log1p",
    "aten::expm1",
    "aten::sin",
    "aten::cos",
    "aten::tanh",
    "aten::sigmoid",
    "aten::relu",
    "aten::gelu",
    "aten::silu",
    "aten::erf",
    "aten::clamp",
    "aten::clamp_min",
    "aten::clamp_max",
    "aten::maximum",
    "aten::minimum",
    "aten::where.self",
    "aten::sign",
    "aten::floor",
    "aten::ceil",
    "aten::round",
    // Comparison and logic.
    "aten::eq.Tensor",
    "aten::eq.Scalar",
    "aten::ne.Tensor",
    "aten::ne.Scalar",
    "aten::lt.Tensor",
    "aten::lt.Scalar",
    "aten::le.Tensor",
    "aten::le.Scalar",
    "aten::gt.Tensor",
    "aten::gt.Scalar",
    "aten::ge.Tensor",
    "aten::ge.Scalar",
    "aten::logical_not",
    "aten::logical_and",
    "aten::logical_or",
    // Reductions.
    "aten::sum.dim_IntList",
    "aten::sum",
    "aten::mean.dim",
    "aten::amax",
    "aten::amin",
    "aten::max.dim",
    "aten::min.dim",
    "aten::argmax",
    "aten::argmin",
    "aten::prod.dim_int",
    "aten::var.correction",
    "aten::_softmax",
    "aten::_log_softmax",
    // Views and layout.
    "aten::view",
    "aten::reshape",
    "aten::permute",
    "aten::transpose.int",
    "aten::t",
    "aten::expand",
    "aten::squeeze.dim",
    "aten::unsqueeze",
    "aten::slice.Tensor",
    "aten::select.int",
    "aten::clone",
    "aten::contiguous",
    "aten::cat",
    "aten::stack",
    "aten::_to_copy",
    "aten::alias",
    // Creation.
    "aten::full",
    "aten::zeros",
    "aten::ones",
    "aten::arange.start_step",
    "aten::empty.memory_format",
    // Library calls (ATen kernels, not generated).
    "aten::mm",
    "aten::bmm",
    "aten::addmm",
    "aten::matmul",
    "aten::linear",
    "aten::convolution",
    "aten::native_layer_norm",
    "aten::native_batch_norm",
    "aten::embedding",
    "aten::index_select",
    "aten::gather",
};

}  // namespace

OpAllowlist OpAllowlist::Default() {
  OpAllowlist list;
  for (const char* op : kDefaultOps) list.Add(op);
  return list;
}

}  // namespace kiln::compiler
