// Small, valid compile requests for tests: relu(x + x) over a float tensor whose size is chosen
// by `variant`, so that different variants have different cache keys.
#pragma once

#include <string>

#include "kiln/v1/service.pb.h"

namespace kiln::testing {

inline void SetContiguous(kiln::v1::TensorMeta* meta, std::initializer_list<int64_t> sizes) {
  meta->set_dtype(kiln::v1::DTYPE_FLOAT32);
  meta->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
  meta->clear_sizes();
  meta->clear_strides();
  for (int64_t s : sizes) meta->add_sizes(s);
  int64_t stride = 1;
  std::vector<int64_t> strides(sizes.size());
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= meta->sizes(i);
  }
  for (int64_t s : strides) meta->add_strides(s);
}

inline kiln::v1::CompileRequest MakeRequest(int variant = 0) {
  kiln::v1::CompileRequest request;
  request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
  request.mutable_target()->set_cpu_isa("x86-64-v3");
  kiln::v1::Graph* graph = request.mutable_graph();
  kiln::v1::Value* x = graph->add_inputs();
  x->set_id(0);
  SetContiguous(x->mutable_meta(), {4, 4 + variant});

  kiln::v1::Node* add = graph->add_nodes();
  add->set_op("aten::add.Tensor");
  add->add_args()->set_value(0);
  add->add_args()->set_value(0);
  kiln::v1::Value* sum = add->add_outputs();
  sum->set_id(1);
  *sum->mutable_meta() = x->meta();

  kiln::v1::Node* relu = graph->add_nodes();
  relu->set_op("aten::relu");
  relu->add_args()->set_value(1);
  kiln::v1::Value* out = relu->add_outputs();
  out->set_id(2);
  *out->mutable_meta() = x->meta();
  graph->add_outputs(2);
  return request;
}

}  // namespace kiln::testing
