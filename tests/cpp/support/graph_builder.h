// Hand-built kiln.v1 graphs for compiler tests: inputs, constants and nodes added in topological
// order with ids handed out in order of definition, and the arguments nodes take.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/v1/service.pb.h"

namespace kiln::testing {

inline kiln::v1::Argument ValueArg(uint32_t id) {
  kiln::v1::Argument a;
  a.set_value(id);
  return a;
}
inline kiln::v1::Argument IntArg(int64_t v) {
  kiln::v1::Argument a;
  a.set_int_value(v);
  return a;
}
inline kiln::v1::Argument FloatArg(double v) {
  kiln::v1::Argument a;
  a.set_float_value(v);
  return a;
}
inline kiln::v1::Argument BoolArg(bool v) {
  kiln::v1::Argument a;
  a.set_bool_value(v);
  return a;
}
inline kiln::v1::Argument IntsArg(const std::vector<int64_t>& v) {
  kiln::v1::Argument a;
  for (int64_t x : v) a.mutable_int_list()->add_values(x);
  return a;
}

inline std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= sizes[d];
  }
  return strides;
}

// Values are CPU tensors; strides default to row-major.
class GraphBuilder {
 public:
  uint32_t Input(std::vector<int64_t> sizes, kiln::v1::DType dtype = kiln::v1::DTYPE_FLOAT32,
                 std::vector<int64_t> strides = {}) {
    kiln::v1::Value* v = graph_.add_inputs();
    v->set_id(next_);
    SetMeta(v->mutable_meta(), sizes, dtype, strides);
    return next_++;
  }
  uint32_t Op(const std::string& op, std::vector<kiln::v1::Argument> args,
              std::vector<int64_t> sizes, kiln::v1::DType dtype = kiln::v1::DTYPE_FLOAT32,
              std::vector<int64_t> strides = {}) {
    kiln::v1::Node* n = graph_.add_nodes();
    n->set_op(op);
    for (kiln::v1::Argument& a : args) *n->add_args() = std::move(a);
    kiln::v1::Value* v = n->add_outputs();
    v->set_id(next_);
    SetMeta(v->mutable_meta(), sizes, dtype, strides);
    return next_++;
  }
  void Output(uint32_t id) { graph_.add_outputs(id); }
  // The first `n` inputs are parameters the client binds once (Graph.num_bound_inputs).
  void Bound(uint32_t n) { graph_.set_num_bound_inputs(n); }
  const kiln::v1::Graph& graph() const { return graph_; }

  kiln::v1::CompileRequest Request() const {
    kiln::v1::CompileRequest request;
    request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
    *request.mutable_graph() = graph_;
    return request;
  }

 private:
  static void SetMeta(kiln::v1::TensorMeta* m, const std::vector<int64_t>& sizes,
                      kiln::v1::DType dtype, std::vector<int64_t> strides) {
    m->set_dtype(dtype);
    m->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
    if (strides.empty()) strides = RowMajorStrides(sizes);
    for (int64_t s : sizes) m->add_sizes(s);
    for (int64_t s : strides) m->add_strides(s);
  }

  kiln::v1::Graph graph_;
  uint32_t next_ = 0;
};

}  // namespace kiln::testing
