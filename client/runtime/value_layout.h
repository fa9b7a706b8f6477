// ValueMeta: a plan value's dtype and layout as the runtime runs it, and what the runtime makes
// and checks of tensors with it (new tensors in exactly that layout, copies into it, the bytes it
// spans, how errors describe it).
#ifndef KILN_RUNTIME_VALUE_LAYOUT_H_
#define KILN_RUNTIME_VALUE_LAYOUT_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::runtime {

// A value's metadata as the plan runs it (kiln.v1.TensorMeta without device and requires_grad): a
// kernel is compiled for exactly this dtype, these sizes and strides.
struct ValueMeta {
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // In elements; as many as sizes.
  int64_t storage_offset = 0;    // In elements.
};

// "value 7": how errors name a plan's value.
std::string ValueName(uint32_t id);

// "Float[4, 3] strides [3, 1]", for errors.
std::string Describe(at::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides);

// Elements of storage a tensor with this metadata reaches (storage offset included). Plan::Create
// checked that it and its bytes fit in int64_t for every value of the plan.
int64_t StorageElements(const ValueMeta& m);

// StorageElements in bytes, or nullopt when it or its bytes overflow int64_t (a plan that would
// make the arena's bounds check wrap around).
std::optional<int64_t> CheckedStorageBytes(const ValueMeta& m);

// A new tensor with exactly the metadata's sizes, strides and storage offset.
at::Tensor EmptyWithLayout(const ValueMeta& m, const at::TensorOptions& options);

// Whether `t` has the metadata's strides and storage offset.
bool HasLayout(const at::Tensor& t, const ValueMeta& m);

// A copy of `t` with the metadata's layout (for a `t` that lacks it), of `t`'s dtype or `dtype`.
at::Tensor CopyWithLayout(const at::Tensor& t, const ValueMeta& m,
                          std::optional<at::ScalarType> dtype = std::nullopt);

// A Python number where the schema takes a Tensor (x * 2.0 traced as aten::mul.Tensor): a
// wrapped number, as eager PyTorch makes it, so type promotion treats it as a scalar.
at::Tensor WrappedNumber(const c10::Scalar& value);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_VALUE_LAYOUT_H_
