// What the graph passes look up about a graph's values: metadata, the node defining each, the
// next free id, the values a graph output may alias; and an empty copy to rebuild nodes into.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// Every value's metadata, the index of the node defining each node output, and the first id no
// value uses (for values a pass adds).
struct ValueIndex {
  std::unordered_map<uint32_t, const kiln::v1::TensorMeta*> meta;
  std::unordered_map<uint32_t, int> producer;
  uint32_t next_id = 0;
};

ValueIndex IndexValues(const kiln::v1::Graph& graph);

// The graph with `graph`'s inputs (and how many are bound), constants, outputs, declared
// schemas, input updates and size symbols, no nodes.
kiln::v1::Graph EmptyLike(const kiln::v1::Graph& graph);

std::unordered_set<uint32_t> GraphOutputs(const kiln::v1::Graph& graph);

// Values a graph output may alias: the outputs, and the inputs of views that lead to them.
// Merging, dropping or caching the node that makes one would change what the caller's outputs
// share memory with (eager returns a fresh tensor for view(clone(x)), not a view of x).
std::unordered_set<uint32_t> Escaping(const kiln::v1::Graph& graph);

// Readers of each value (node indices, in order; a node reading a value twice appears twice).
std::unordered_map<uint32_t, std::vector<int>> Readers(const kiln::v1::Graph& graph);

// The node a rewrite may absorb after the one defining a value: the value's only reader, when
// exactly one node reads it and no graph output may alias it.
class SoleReaders {
 public:
  explicit SoleReaders(const kiln::v1::Graph& graph);
  // The index of the value's only reader, or -1.
  int Of(uint32_t id) const;

 private:
  std::unordered_map<uint32_t, std::vector<int>> readers_;
  std::unordered_set<uint32_t> escaping_;
};

// How a GEMM's 2-D product of `columns` columns reaches the one node that reads it: directly,
// or through one row-major reshape that keeps its last dimension (a linear over [B, T, K] is a
// GEMM over [B*T, K] viewed back). nullopt when a value on the way has another reader.
struct ProductReader {
  int reader;                             // the reading node's index
  uint32_t value;                         // what it reads: the product, or its reshape
  int reshape = -1;                       // the reshape's index, when there is one
  std::optional<kiln::v1::Value> viewed;  // and its result
};
std::optional<ProductReader> ReaderOfProduct(const kiln::v1::Graph& graph,
                                             const SoleReaders& sole, uint32_t product,
                                             int64_t columns);

// The nodes that define `result` (what a rewrite absorbed after the product `read` starts from)
// by `gemm`, a node whose one output is that 2-D product: `gemm` defining `result` itself, or,
// when the product was reshaped on the way, `gemm` keeping its 2-D product (a new id) and a view
// of it to `result`'s sizes defining `result`, as the reshape did.
std::vector<kiln::v1::Node> DefineThroughReshape(kiln::v1::Node gemm, const ProductReader& read,
                                                 const kiln::v1::Value& result,
                                                 ValueIndex& index);

std::vector<int64_t> Sizes(const kiln::v1::TensorMeta& m);
std::vector<int64_t> Strides(const kiln::v1::TensorMeta& m);

// Same dtype, sizes and strides.
bool SameLayout(const kiln::v1::TensorMeta& a, const kiln::v1::TensorMeta& b);

// An int or float argument equal to 1 (an alpha that changes nothing).
bool IsUnitScalar(const kiln::v1::Argument& a);

// The other operand of `add` when it is a plain `value + other` or `other + value`
// (aten::add.Tensor, alpha absent or 1, two distinct positional tensors), else nullopt.
std::optional<uint32_t> OtherAddend(const kiln::v1::Node& add, uint32_t value);

// `graph` with node i replaced by replace[i] (nothing, when empty) wherever replace has an entry.
kiln::v1::Graph ReplaceNodes(const kiln::v1::Graph& graph,
                             std::unordered_map<int, std::vector<kiln::v1::Node>> replace);

// Contiguous (row-major) strides of `sizes`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes);

}  // namespace kiln::compiler
