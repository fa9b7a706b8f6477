// Validation of compile requests from the wire. A request that passes is well-formed: every op
// is admitted (allowlisted, or a functional aten op by its declared schema: op_admission.h),
// every declared schema parses and is named for its op, every value is defined once before it
// is used, every tensor's metadata is consistent, constants hold exactly their bytes, every input
// update names a graph input once and a value of its dtype and sizes, and the target is one kiln
// knows. A graph with size symbols has every expression canonical over them (sym_expr.h), each
// symbol bound to a per-call input's dimension, and no input update. Compilers may rely on all
// of this.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "compiler/ir/op_allowlist.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compiler {

struct ValidationLimits {
  int max_nodes = 100000;
  int max_values = 400000;
  int max_rank = 16;
  int max_size_symbols = 64;
  int max_args_per_node = 64;
  int max_options = 64;
  int max_schemas = 4096;
  int max_schema_chars = 8192;
  int64_t max_numel = int64_t{1} << 40;  // per tensor
};

// OK, or InvalidArgument naming what is wrong (and the node index when a node is at fault).
absl::Status ValidateRequest(const kiln::v1::CompileRequest& request, const OpAllowlist& ops,
                             const ValidationLimits& limits = {});

// Bytes per element of `dtype`, or 0 for DTYPE_UNSPECIFIED / unknown values.
int ElementSize(kiln::v1::DType dtype);

}  // namespace kiln::compiler
