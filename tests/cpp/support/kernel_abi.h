// Calling generated CPU kernels from tests: the kernel ABI (kiln/v1/kernel_abi.h) with a
// parallel_for that runs the whole range on the calling thread, in chunks of `grain` so chunk
// boundaries are exercised as they are on a thread pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/v1/kernel_abi.h"

namespace kiln::testing {

// A kiln_parallel_for_fn.
inline void ChunkedParallelFor(int64_t begin, int64_t end, int64_t grain, kiln_range_fn fn,
                               void* const* args) {
  const int64_t step = std::max<int64_t>(grain, 1);
  for (int64_t b = begin; b < end; b += step) fn(b, std::min(end, b + step), args);
}

// n floats start, start + step, ...: kernel inputs whose every element differs.
inline std::vector<float> Iota(int n, float start, float step) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

}  // namespace kiln::testing
