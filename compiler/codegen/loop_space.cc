// CollapseLoops: drop, order, merge, in that order, so that merging sees the final order.
#include "compiler/codegen/loop_space.h"

#include <algorithm>

namespace kiln::compiler {

LoopSpace CollapseLoops(const std::vector<int64_t>& sizes,
                        const std::vector<std::vector<int64_t>>& strides, int order_by) {
  const int rank = static_cast<int>(sizes.size());
  const size_t n = strides.size();
  // Dimensions of size 1 take no loop (one remains when all are 1).
  std::vector<int64_t> kept_sizes;
  std::vector<std::vector<int64_t>> kept(n);
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] == 1 && !(d == rank - 1 && kept_sizes.empty())) continue;
    kept_sizes.push_back(sizes[d]);
    for (size_t a = 0; a < n; ++a) kept[a].push_back(sizes[d] == 1 ? 0 : strides[a][d]);
  }
  if (order_by >= 0) {
    const std::vector<int64_t> key = kept[order_by];
    std::vector<int> order(kept_sizes.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int>(d);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
    std::vector<int64_t> permuted_sizes;
    for (int d : order) permuted_sizes.push_back(kept_sizes[d]);
    kept_sizes = permuted_sizes;
    for (auto& s : kept) {
      std::vector<int64_t> permuted;
      for (int d : order) permuted.push_back(s[d]);
      s = permuted;
    }
  }
  LoopSpace space;
  space.sizes = {kept_sizes[0]};
  space.strides.resize(n);
  for (size_t a = 0; a < n; ++a) space.strides[a] = {kept[a][0]};
  for (size_t d = 1; d < kept_sizes.size(); ++d) {
    bool merge = true;
    for (size_t a = 0; a < n; ++a) {
      merge = merge && space.strides[a].back() == kept[a][d] * kept_sizes[d];
    }
    if (merge) {
      space.sizes.back() *= kept_sizes[d];
      for (size_t a = 0; a < n; ++a) space.strides[a].back() = kept[a][d];
    } else {
      space.sizes.push_back(kept_sizes[d]);
      for (size_t a = 0; a < n; ++a) space.strides[a].push_back(kept[a][d]);
    }
  }
  return space;
}

std::string Decompose(const std::vector<int64_t>& sizes, const std::string& p,
                      const std::string& name, const std::string& type, const std::string& indent,
                      int first_dim, const std::string& last) {
  const int rank = static_cast<int>(sizes.size());
  std::vector<std::string> defs(rank);
  int64_t inner = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const std::string index =
        !last.empty() && d + 1 == rank ? last : name + std::to_string(d + first_dim);
    defs[d] = indent + "const " + type + " " + index + " = " + p +
              (inner > 1 ? " / " + std::to_string(inner) : "") +
              (d > 0 ? " % " + std::to_string(sizes[d]) : "") + ";\n";
    inner *= sizes[d];
  }
  std::string out;
  for (const auto& def : defs) out += def;
  return out;
}

std::string OuterExtent(int64_t size, int64_t runtime_outer) {
  if (runtime_outer == 0) return std::to_string(size);
  const int64_t factor = size / runtime_outer;
  return factor == 1 ? std::string(kOuterExtent)
                     : "(" + std::string(kOuterExtent) + " * " + std::to_string(factor) + ")";
}

std::string ExtentProduct(const std::vector<int64_t>& sizes, int64_t runtime_outer) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return OuterExtent(n, sizes.empty() ? 0 : runtime_outer);
}

}  // namespace kiln::compiler
