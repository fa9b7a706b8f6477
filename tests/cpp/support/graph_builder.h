// Hand-built kiln.v1 graphs for compiler tests: a builder that hands out value ids in order of
// definition, argument shorthands, and graphs several suites share (a convolution + batch norm).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/v1/service.pb.h"

namespace kiln::testing {

using kiln::v1::Argument;
using kiln::v1::DType;
using kiln::v1::Graph;

inline constexpr DType kF32 = kiln::v1::DTYPE_FLOAT32;

inline Argument V(uint32_t id) {
  Argument a;
  a.set_value(id);
  return a;
}
inline Argument I(int64_t v) {
  Argument a;
  a.set_int_value(v);
  return a;
}
inline Argument F(double v) {
  Argument a;
  a.set_float_value(v);
  return a;
}
inline Argument Ints(std::vector<int64_t> v) {
  Argument a;
  for (int64_t x : v) a.mutable_int_list()->add_values(x);
  return a;
}
inline Argument B(bool v) {
  Argument a;
  a.set_bool_value(v);
  return a;
}
inline Argument None() {
  Argument a;
  a.mutable_none();
  return a;
}
inline Argument Named(const std::string& name, Argument a) {
  a.set_name(name);
  return a;
}

inline std::vector<int64_t> RowMajor(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= sizes[d];
  }
  return strides;
}

// Builds a graph in topological order; ids are handed out in order of definition.
class GraphBuilder {
 public:
  uint32_t Input(std::vector<int64_t> sizes, DType dtype = kF32, std::vector<int64_t> strides = {},
                 int64_t offset = 0) {
    kiln::v1::Value* v = graph_.add_inputs();
    v->set_id(next_);
    SetMeta(v->mutable_meta(), sizes, dtype, strides, offset);
    return next_++;
  }
  uint32_t Constant(std::vector<int64_t> sizes, DType dtype, std::string bytes) {
    kiln::v1::Constant* c = graph_.add_constants();
    c->mutable_value()->set_id(next_);
    SetMeta(c->mutable_value()->mutable_meta(), sizes, dtype, {}, 0);
    c->set_data(std::move(bytes));
    return next_++;
  }
  uint32_t Op(const std::string& op, std::vector<Argument> args, std::vector<int64_t> sizes,
              DType dtype = kF32, std::vector<int64_t> strides = {}, int64_t offset = 0) {
    kiln::v1::Node* n = graph_.add_nodes();
    n->set_op(op);
    for (Argument& a : args) *n->add_args() = std::move(a);
    kiln::v1::Value* v = n->add_outputs();
    v->set_id(next_);
    SetMeta(v->mutable_meta(), sizes, dtype, strides, offset);
    return next_++;
  }
  // A node with one output per entry of `sizes` (all of `dtype`, row-major); their ids.
  std::vector<uint32_t> OpN(const std::string& op, std::vector<Argument> args,
                            std::vector<std::vector<int64_t>> sizes, DType dtype = kF32) {
    kiln::v1::Node* n = graph_.add_nodes();
    n->set_op(op);
    for (Argument& a : args) *n->add_args() = std::move(a);
    std::vector<uint32_t> ids;
    for (const auto& s : sizes) {
      kiln::v1::Value* v = n->add_outputs();
      v->set_id(next_);
      SetMeta(v->mutable_meta(), s, dtype, {}, 0);
      ids.push_back(next_++);
    }
    return ids;
  }
  void Output(uint32_t id) { graph_.add_outputs(id); }
  // The graph declares `op`'s schema (kiln.v1.OpSchema).
  void Declare(const std::string& op, const std::string& schema,
               std::vector<std::string> tags = {}) {
    kiln::v1::OpSchema* s = graph_.add_schemas();
    s->set_op(op);
    s->set_schema(schema);
    for (std::string& tag : tags) s->add_tags(std::move(tag));
  }
  // After the graph, input `input` holds `value` (kiln.v1.InputUpdate); returns the update.
  kiln::v1::InputUpdate* Update(uint32_t input, uint32_t value) {
    kiln::v1::InputUpdate* u = graph_.add_input_updates();
    u->set_input(input);
    u->set_value(value);
    return u;
  }
  // The first `n` inputs are parameters the client binds once (Graph.num_bound_inputs).
  void Bound(uint32_t n) { graph_.set_num_bound_inputs(n); }
  const Graph& graph() const { return graph_; }

  kiln::v1::CompileRequest Request() const {
    kiln::v1::CompileRequest request;
    request.mutable_target()->set_device_kind(kiln::v1::DEVICE_KIND_CPU);
    *request.mutable_graph() = graph_;
    return request;
  }

 private:
  static void SetMeta(kiln::v1::TensorMeta* m, const std::vector<int64_t>& sizes, DType dtype,
                      std::vector<int64_t> strides, int64_t offset) {
    m->set_dtype(dtype);
    m->mutable_device()->set_kind(kiln::v1::DEVICE_KIND_CPU);
    if (strides.empty()) strides = RowMajor(sizes);
    for (int64_t s : sizes) m->add_sizes(s);
    for (int64_t s : strides) m->add_strides(s);
    m->set_storage_offset(offset);
  }

  Graph graph_;
  uint32_t next_ = 0;
};

// x -> conv(w, b) -> eval batch norm (mean, rsqrt(var + eps), gamma, beta as [C, 1, 1] views of
// parameters), as lowering decomposes it; w, b, mean, var, gamma, beta bound. With
// `extra_reader`, the convolution's own result is returned too.
struct ConvBn {
  GraphBuilder b;
  uint32_t x, w, bias, mean, var, gamma, beta, conv, out;
  explicit ConvBn(bool extra_reader = false) {
    w = b.Input({4, 3, 3, 3});
    bias = b.Input({4});
    mean = b.Input({4});
    var = b.Input({4});
    gamma = b.Input({4});
    beta = b.Input({4});
    b.Bound(6);
    x = b.Input({2, 3, 8, 8});
    conv = b.Op("aten::convolution",
                {V(x), V(w), V(bias), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false),
                 Ints({0, 0}), I(1)},
                {2, 4, 8, 8});
    uint32_t eps = b.Op("aten::add.Tensor", {V(var), F(1e-5)}, {4});
    uint32_t inv = b.Op("aten::rsqrt", {V(eps)}, {4});
    auto column = [&](uint32_t v) {
      return b.Op("aten::view", {V(v), Ints({4, 1, 1})}, {4, 1, 1});
    };
    uint32_t sub = b.Op("aten::sub.Tensor", {V(conv), V(column(mean))}, {2, 4, 8, 8});
    uint32_t mul = b.Op("aten::mul.Tensor", {V(sub), V(column(inv))}, {2, 4, 8, 8});
    uint32_t mul2 = b.Op("aten::mul.Tensor", {V(mul), V(column(gamma))}, {2, 4, 8, 8});
    out = b.Op("aten::add.Tensor", {V(mul2), V(column(beta))}, {2, 4, 8, 8});
    b.Output(out);
    if (extra_reader) b.Output(conv);
  }
};

// `layers` blocks over x [64, 256], each with weights of its own: mm, gelu(+ bias) (a pointwise
// kernel), mm, minus the row mean (a row kernel); then mm to [64, 128] and gelu(+ bias) (another
// pointwise kernel). 2 * layers + 1 kernel steps, 3 distinct kernels.
inline GraphBuilder RepeatedLayers(int layers, DType dtype = kF32) {
  GraphBuilder b;
  uint32_t x = b.Input({64, 256}, dtype);
  auto dense = [&](uint32_t in, int64_t n) {
    uint32_t w = b.Input({256, n}, dtype), bias = b.Input({n}, dtype);
    uint32_t s = b.Op("aten::mm", {V(in), V(w)}, {64, n}, dtype);
    return b.Op("aten::gelu", {V(b.Op("aten::add.Tensor", {V(s), V(bias)}, {64, n}, dtype))},
                {64, n}, dtype);
  };
  for (int i = 0; i < layers; ++i) {
    uint32_t w = b.Input({256, 256}, dtype);
    uint32_t t = b.Op("aten::mm", {V(dense(x, 256)), V(w)}, {64, 256}, dtype);
    uint32_t mean = b.Op("aten::mean.dim", {V(t), Ints({-1}), B(true)}, {64, 1}, dtype);
    x = b.Op("aten::sub.Tensor", {V(t), V(mean)}, {64, 256}, dtype);
  }
  b.Output(dense(x, 128));
  return b;
}

}  // namespace kiln::testing
