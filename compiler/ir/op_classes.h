// Which ATen ops the CPU compiler generates code for (pointwise), which only re-describe their
// input's storage (views), and which it leaves to ATen (library calls).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

enum class OpClass {
  kPointwise,  // in the pointwise table (ir/pointwise_ops.h): fusable into a kernel
  kView,       // the result may share storage with the first input
  kLibrary,    // everything else: a LibraryCall step
};

OpClass ClassifyOp(std::string_view op);

// True for ops whose result may alias an input: the result's TensorMeta then describes the
// input's storage only when the op did not copy (see IsAlwaysView). Values such ops read must
// not live in the per-call arena.
bool MayAliasInput(std::string_view op);

// True for the views that never copy (view, permute, expand, select, ...): their result's
// strides and storage offset address their first input's storage. reshape and contiguous copy
// when the input's layout does not allow a view, so they are not among them.
bool IsAlwaysView(std::string_view op);

// view, _unsafe_view and reshape: a new shape of the same elements in row-major order.
bool IsReshapeLike(std::string_view op);

// True for the library ops that write their result into their first input and return it
// (mkldnn::_convolution_pointwise_.binary accumulates a convolution into its residual): the
// result is the first input's storage, so that input must not live in the per-call arena, and
// it may be overwritten only when nothing reads it afterwards (the pass introducing such an op
// proves that).
bool WritesFirstInput(std::string_view op);

// True for ops whose two calls with equal arguments may differ (random, uninitialized memory):
// common-subexpression elimination leaves them alone.
bool IsNondeterministic(std::string_view op);

// The ops of one graph whose two calls with equal arguments may differ: IsNondeterministic's by
// name, and those the graph declares tagged nondeterministic_seeded (kiln.v1.OpSchema: torch's
// random ops, its fused attention kernels, which draw for their dropout). Such calls are never
// merged (CSE), cached (the prologue) or reordered against each other (horizontal fusion): each
// draws from the generator where eager's did.
class NondeterministicOps {
 public:
  explicit NondeterministicOps(const kiln::v1::Graph& graph);
  bool Contains(std::string_view op) const;

 private:
  std::unordered_set<std::string> declared_;
};

// The ids of the values `node` reads, in argument order (Tensor and Tensor[] arguments).
std::vector<uint32_t> ValuesRead(const kiln::v1::Node& node);

// aten::convolution with its nine arguments positional, tensor input and weight, not transposed
// and an int `groups`: (input, weight, bias, stride, padding, dilation, transposed,
// output_padding, groups).
bool IsForwardConvolution(const kiln::v1::Node& node);

// True when `meta` is row-major contiguous (size-1 dims may have any stride); storage offset
// not considered.
bool IsRowMajor(const kiln::v1::TensorMeta& meta);

}  // namespace kiln::compiler
