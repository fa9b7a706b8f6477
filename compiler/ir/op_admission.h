// Which ops a graph may call: those on the allowlist (op_allowlist.h), which kiln's passes and
// generators know by name, and any other ATen op whose declared schema (kiln.v1.OpSchema) makes
// it a pure function of its arguments, which the plan runs as a library call. A graph with one op
// kilnd has no kernel for is then compiled around that op instead of running eagerly whole.
//
// The rule, for an op off the allowlist (each a reason to refuse, named in the error):
//  - its name is "aten::<name>[.<overload>]" and the graph declares its schema under that name;
//  - the schema writes no argument and aliases none ("Tensor(a!)", "Tensor(a)": in-place ops,
//    out= variants and views, whose memory effects only ops kiln knows by name may have);
//  - its arguments are of the types a kiln.v1 Argument carries (tensors, numbers, lists of them,
//    strings, dtypes, devices, layouts, memory formats; a Generator only as None), never a
//    Stream, Storage or object;
//  - it returns at least one tensor, and otherwise only tensors, tensor lists and numbers (the
//    int sizes CUDA's attention kernels return beside their tensors), and the node has one
//    output per tensor result (any number with a tensor list);
//  - its tags do not say its results' sizes or values are read on the host
//    (dynamic_output_shape, data_dependent_output: a host synchronisation, and sizes a static
//    graph cannot have) or that it changes its argument's metadata (inplace_view);
//  - it is not on the denylist: ops with effects beyond their results (a file read, the host
//    reading a device value, an assertion, global state such as cuFFT's plan cache or cuDNN's
//    dropout state) or that bypass the schema's own account of what they write (_copy_from).
// Random ops (tagged nondeterministic_seeded) are admitted: the plan calls them as eager does, in
// the graph's order, from the same generator, and the compiler never merges, reorders or caches
// them (op_classes.h, IsRandom), so a program seeded as eager was draws eager's numbers.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "compiler/ir/op_allowlist.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// OK when `node` may be compiled: its op is on `allowlist`, or `declared` (the graph's schema of
// node.op(), null when it declares none) admits it by the rule above. Otherwise InvalidArgument
// whose message says why: "op 'aten::foo' is not on the allowlist and ...".
absl::Status AdmitOp(const kiln::v1::Node& node, const OpAllowlist& allowlist,
                     const kiln::v1::OpSchema* declared);

// The reason the denylist gives for `op` ("reads a device value on the host"), or empty when it
// is not on the denylist. Overloads share their op's entry.
std::string_view DeniedBecause(std::string_view op);

}  // namespace kiln::compiler
