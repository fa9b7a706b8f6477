// The kiln.v1 -> c10 tables, as kiln.graph.lowering writes them in the other direction.
#include "runtime/wire_types.h"

#include <limits>

namespace kiln::runtime {

std::optional<c10::ScalarType> ScalarTypeOf(WireDType dtype) {
  switch (dtype) {
    case WireDType::kFloat32:
      return c10::ScalarType::Float;
    case WireDType::kFloat64:
      return c10::ScalarType::Double;
    case WireDType::kFloat16:
      return c10::ScalarType::Half;
    case WireDType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case WireDType::kInt8:
      return c10::ScalarType::Char;
    case WireDType::kInt16:
      return c10::ScalarType::Short;
    case WireDType::kInt32:
      return c10::ScalarType::Int;
    case WireDType::kInt64:
      return c10::ScalarType::Long;
    case WireDType::kUInt8:
      return c10::ScalarType::Byte;
    case WireDType::kBool:
      return c10::ScalarType::Bool;
    case WireDType::kComplex64:
      return c10::ScalarType::ComplexFloat;
    case WireDType::kComplex128:
      return c10::ScalarType::ComplexDouble;
    case WireDType::kUInt64:
      return c10::ScalarType::UInt64;
    case WireDType::kUnspecified:
      break;
  }
  return std::nullopt;
}

std::optional<c10::MemoryFormat> MemoryFormatOf(WireMemoryFormat format) {
  switch (format) {
    case WireMemoryFormat::kContiguous:
      return c10::MemoryFormat::Contiguous;
    case WireMemoryFormat::kPreserve:
      return c10::MemoryFormat::Preserve;
    case WireMemoryFormat::kChannelsLast:
      return c10::MemoryFormat::ChannelsLast;
    case WireMemoryFormat::kChannelsLast3d:
      return c10::MemoryFormat::ChannelsLast3d;
    case WireMemoryFormat::kUnspecified:
      break;
  }
  return std::nullopt;
}

std::optional<c10::Layout> LayoutOf(WireLayout layout) {
  if (layout == WireLayout::kStrided) return c10::Layout::Strided;
  return std::nullopt;
}

std::optional<c10::Device> DeviceOf(const DeviceSpec& device) {
  if (device.index < 0 || device.index > std::numeric_limits<c10::DeviceIndex>::max()) {
    return std::nullopt;
  }
  const auto index = static_cast<c10::DeviceIndex>(device.index);
  switch (device.kind) {
    case WireDeviceKind::kCpu:
      return c10::Device(c10::DeviceType::CPU);  // As torch.device("cpu"): no index.
    case WireDeviceKind::kCuda:
      return c10::Device(c10::DeviceType::CUDA, index);
    case WireDeviceKind::kUnspecified:
      break;
  }
  return std::nullopt;
}

}  // namespace kiln::runtime
