// ValueMeta's layouts: checked extents, tensors made or copied into exactly a value's layout.
#include "runtime/value_layout.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>

namespace kiln::runtime {

std::string ValueName(uint32_t id) { return "value " + std::to_string(id); }

namespace {

std::string Ints(c10::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace

// Formatted by hand: c10::str of an ArrayRef crashed on the CPython 3.12 + torch 2.11 host.
std::string Describe(at::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return std::string(c10::toString(dtype)) + Ints(sizes) + " strides " + Ints(strides);
}

int64_t StorageElements(const ValueMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return m.storage_offset;
    extent += (m.sizes[d] - 1) * m.strides[d];
  }
  return m.storage_offset + extent;
}

std::optional<int64_t> CheckedStorageBytes(const ValueMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) {
      extent = 0;
      break;
    }
    int64_t span = 0;
    if (__builtin_mul_overflow(m.sizes[d] - 1, m.strides[d], &span) ||
        __builtin_add_overflow(extent, span, &extent)) {
      return std::nullopt;
    }
  }
  int64_t elements = 0, bytes = 0;
  if (__builtin_add_overflow(m.storage_offset, extent, &elements) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(c10::elementSize(m.dtype)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

at::Tensor EmptyWithLayout(const ValueMeta& m, const at::TensorOptions& options) {
  if (m.storage_offset == 0) return at::empty_strided(m.sizes, m.strides, options);
  return at::empty({StorageElements(m)}, options).as_strided(m.sizes, m.strides, m.storage_offset);
}

bool HasLayout(const at::Tensor& t, const ValueMeta& m) {
  return t.strides() == c10::IntArrayRef(m.strides) && t.storage_offset() == m.storage_offset;
}

at::Tensor CopyWithLayout(const at::Tensor& t, const ValueMeta& m,
                          std::optional<at::ScalarType> dtype) {
  at::Tensor copy = EmptyWithLayout(m, t.options().dtype(dtype.value_or(t.scalar_type())));
  copy.copy_(t);
  return copy;
}

at::Tensor WrappedNumber(const c10::Scalar& value) {
  at::Tensor t = c10::scalar_to_tensor(value);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

}  // namespace kiln::runtime
