// The reductions the code generators fuse with their pointwise prologues and epilogues:
// sum, mean, amax, amin, var, std and var_mean over the trailing dimensions of their input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

enum class ReductionKind { kSum, kMean, kAmax, kAmin, kVar, kStd, kVarMean };

struct Reduction {
  ReductionKind kind;
  uint32_t input = 0;
  int outer_rank = 0;  // The input's leading dims that are kept; the rest are reduced.
  bool keepdim = false;
  double correction = 1;  // var, var_mean: the divisor is n - correction.
};

// True when `op` names one of the reductions MatchReduction may accept.
bool IsReductionOp(const std::string& op);

// The reduction `node` computes when the generator can fuse it: a float (f32, f64, bf16, f16)
// input on a device of kind `device`, a result of the input's dtype, a non-empty set of reduced
// dims that are exactly the input's trailing ones with at least two elements between them, and at
// least one kept row.
std::optional<Reduction> MatchReduction(
    const kiln::v1::Node& node,
    const std::unordered_map<uint32_t, const kiln::v1::TensorMeta*>& meta,
    kiln::v1::DeviceKind device = kiln::v1::DEVICE_KIND_CPU);

// Rewrites the dim argument of `node` (a reduction MatchReduction accepts over an input of rank
// `rank`) to count from the end: it then names the same reduced dims of an input whose leading
// (kept) dims were merged into one. False when `node` has no such argument.
bool DimsFromEnd(kiln::v1::Node& node, int rank);

}  // namespace kiln::compiler
