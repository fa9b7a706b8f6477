// kiln.v1's dtype, device, memory format and layout (plan_spec.h) as c10's values: kiln's wire
// numbering never follows torch's, so plans stay valid when torch renumbers its enums.
#ifndef KILN_RUNTIME_WIRE_TYPES_H_
#define KILN_RUNTIME_WIRE_TYPES_H_

#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <optional>

#include "runtime/plan_spec.h"

namespace kiln::runtime {

// Each is nullopt for a number kiln.v1 does not define, or UNSPECIFIED.
std::optional<c10::ScalarType> ScalarTypeOf(WireDType dtype);
std::optional<c10::MemoryFormat> MemoryFormatOf(WireMemoryFormat format);
std::optional<c10::Layout> LayoutOf(WireLayout layout);
// Also nullopt for an index c10::Device cannot hold (negative, or past c10::DeviceIndex).
std::optional<c10::Device> DeviceOf(const DeviceSpec& device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_WIRE_TYPES_H_
