// The loop nest a pointwise kernel walks, shared by the CPU and CUDA generators: the iteration
// space with size-1 dims dropped, ordered by an output's memory layout, and dims that every
// access walks as one merged; and the indices of a flat position in it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::compiler {

struct LoopSpace {
  std::vector<int64_t> sizes;                 // outermost first; never empty
  std::vector<std::vector<int64_t>> strides;  // per access, one per dim of `sizes`
};

// Collapses `sizes` (rank >= 1) walked by accesses with `strides` (each of the same rank; 0 for
// broadcast dims): dims of size 1 are dropped (one remains when all are 1); then dims are ordered
// by access `order_by`'s strides, largest outermost (stable; -1 keeps the order), so that access
// is walked in memory order; then dim d folds into d-1 when every access walks the two as one.
// The element count is unchanged.
LoopSpace CollapseLoops(const std::vector<int64_t>& sizes,
                        const std::vector<std::vector<int64_t>>& strides, int order_by);

// The definitions, at `indent`, of the indices of flat position `p` (an expression) over the
// row-major `sizes`: "const <type> <name><first_dim + d> = <p> / <inner> % <size>;" per dim, the
// last one named `last` instead when given.
std::string Decompose(const std::vector<int64_t>& sizes, const std::string& p,
                      const std::string& name, const std::string& type, const std::string& indent,
                      int first_dim = 0, const std::string& last = "");

// The name a kernel with a runtime outer extent (FusedGroup::runtime_outer) gives its value.
inline constexpr char kOuterExtent[] = "kiln_outer";

// The code of an outermost extent `size` (of a loop space, or of a group's rows): the number, or
// when `runtime_outer` (the group's sizes[0] at the representative sizes, which divides `size`)
// is not 0, kOuterExtent times size / runtime_outer.
std::string OuterExtent(int64_t size, int64_t runtime_outer);

// The code of the product of `sizes`, the first one OuterExtent's.
std::string ExtentProduct(const std::vector<int64_t>& sizes, int64_t runtime_outer);

}  // namespace kiln::compiler
