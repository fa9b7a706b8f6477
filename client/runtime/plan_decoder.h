// DecodePlan: a serialized kiln.v1.ExecutionPlan (protobuf wire format) into a PlanSpec, without
// libprotobuf: the client extension must build where only CPython, torch and pybind11 are.
#ifndef KILN_RUNTIME_PLAN_DECODER_H_
#define KILN_RUNTIME_PLAN_DECODER_H_

#include <string_view>

#include "runtime/plan_spec.h"
#include "status.h"

namespace kiln::runtime {

// Decodes `bytes` as protobuf's own parser would: fields in any order, repeated numbers packed
// or not, unknown fields (groups included) skipped, a known field with another wire type treated
// as unknown, the last of a repeated singular field winning and a repeated singular message
// merged. Every read is checked against the end of its enclosing message, so no input reads
// outside `bytes`. Fails with kInvalidArgument naming the field path and byte offset
// ("steps[2].library.args[0]: at byte 123: truncated varint") for bytes protobuf would refuse,
// and for a step that names neither a kernel nor a library call. It checks no meaning beyond
// that (ids, enums, shapes): Plan::Create does, once.
//
// The result's ConstantSpec::data views `bytes`, which must outlive its use.
StatusOr<PlanSpec> DecodePlan(std::string_view bytes);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PLAN_DECODER_H_
