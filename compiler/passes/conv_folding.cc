// The convolution + per-channel affine folding. Each fold keeps the graph topological: the new
// weight, bias and convolution take the place of the chain's last node, where every operand of
// the chain is defined.
#include "compiler/passes/conv_folding.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "compiler/ir/graph_index.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"
#include "compiler/ir/window_ops.h"
#include "compiler/passes/bound_prologue.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Argument;
using kiln::v1::Graph;
using kiln::v1::Node;
using kiln::v1::TensorMeta;

// Strides that cover sizes' elements exactly once in some dimension order (contiguous,
// channels-last, ...): a kernel may write a new tensor in that layout.
bool IsDense(const TensorMeta& m) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
  for (int d = 0; d < m.sizes_size(); ++d) {
    if (m.sizes(d) == 0) return false;
    if (m.sizes(d) > 1) dims.emplace_back(m.strides(d), m.sizes(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// The stride of the one dim of a per-channel value whose size is not 1 (1 if there is none):
// the stride of a [C] view of it.
int64_t ChannelStride(const TensorMeta& m) {
  for (int d = 0; d < m.sizes_size(); ++d) {
    if (m.sizes(d) != 1) return m.strides(d);
  }
  return 1;
}

// Appends `op` over `tensor_args` (then `view_sizes` as an int list, for a view) to `nodes`,
// defining a new value of `sizes` (row-major strides unless `strides` is given) in `like`'s
// dtype and on its device. Returns the value's id.
uint32_t EmitNode(std::vector<Node>& nodes, ValueIndex& index, const std::string& op,
                  const std::vector<uint32_t>& tensor_args, const std::vector<int64_t>& sizes,
                  const std::vector<int64_t>* view_sizes, const TensorMeta& like,
                  const std::vector<int64_t>* strides = nullptr) {
  Node n;
  n.set_op(op);
  for (uint32_t id : tensor_args) n.add_args()->set_value(id);
  if (view_sizes) {
    auto* list = n.add_args()->mutable_int_list();
    for (int64_t s : *view_sizes) list->add_values(s);
  }
  kiln::v1::Value* v = n.add_outputs();
  v->set_id(index.next_id++);
  TensorMeta* m = v->mutable_meta();
  m->set_dtype(like.dtype());
  *m->mutable_device() = like.device();
  for (int64_t s : sizes) m->add_sizes(s);
  for (int64_t s : strides ? *strides : ContiguousStrides(sizes)) m->add_strides(s);
  nodes.push_back(std::move(n));
  return nodes.back().outputs(0).id();
}

// One link of the chain: y op c or c op y.
struct Link {
  enum Kind { kAdd, kSub, kMul } kind;
  uint32_t operand;  // the per-channel value c
  int node;
};

class Folder {
 public:
  Folder(const Graph& graph, PassStats* stats)
      : graph_(graph),
        index_(IndexValues(graph)),
        sole_(graph),
        bound_(BoundValues(graph)),
        stats_(stats) {}

  Graph Run() {
    // node index -> nodes that replace it (empty vector: the node is dropped)
    std::unordered_map<int, std::vector<Node>> replace;
    for (int i = 0; i < graph_.nodes_size(); ++i) {
      const Node& conv = graph_.nodes(i);
      if (replace.count(i) || !Foldable(conv)) continue;
      std::vector<Link> chain = Chain(conv);
      if (chain.empty()) continue;
      replace[i] = {};
      for (size_t k = 0; k + 1 < chain.size(); ++k) replace[chain[k].node] = {};
      replace[chain.back().node] = Fold(conv, chain);
      if (stats_) ++stats_->folded_convolutions;
    }
    return ReplaceNodes(graph_, std::move(replace));
  }

 private:
  const TensorMeta& Meta(uint32_t id) const {
    auto it = emitted_.find(id);
    return it != emitted_.end() ? it->second : *index_.meta.at(id);
  }

  bool Foldable(const Node& n) const {
    if (!IsForwardConvolution(n) || !bound_.count(n.args(1).value())) return false;
    const Argument& b = n.args(2);
    if (b.kind_case() == Argument::kValue ? !bound_.count(b.value())
                                          : b.kind_case() != Argument::kNone) {
      return false;
    }
    const TensorMeta& y = n.outputs(0).meta();
    const TensorMeta& wm = Meta(n.args(1).value());
    return y.dtype() == kiln::v1::DTYPE_FLOAT32 && wm.dtype() == kiln::v1::DTYPE_FLOAT32 &&
           y.sizes_size() == 4 && wm.sizes_size() == 4 && wm.sizes(0) == y.sizes(1) && IsDense(wm);
  }

  // Whether `c` holds one value per output channel of a [N, C, H, W] result: right-aligned
  // against it, size C at the channel dim, 1 everywhere else.
  bool PerChannel(uint32_t c, const TensorMeta& y) const {
    if (!bound_.count(c)) return false;
    const TensorMeta& m = Meta(c);
    if (m.dtype() != kiln::v1::DTYPE_FLOAT32 || m.sizes_size() < 3 || m.sizes_size() > 4) {
      return false;
    }
    const int lead = 4 - m.sizes_size();
    for (int d = 0; d < m.sizes_size(); ++d) {
      const int64_t want = lead + d == 1 ? y.sizes(1) : 1;
      if (m.sizes(d) != want) return false;
    }
    return true;
  }

  std::vector<Link> Chain(const Node& conv) const {
    std::vector<Link> chain;
    const TensorMeta& y = conv.outputs(0).meta();
    uint32_t cur = conv.outputs(0).id();
    while (true) {
      const int reader = sole_.Of(cur);
      if (reader < 0) break;
      const Node& n = graph_.nodes(reader);
      if (n.outputs_size() != 1 || n.args_size() < 2) break;
      const TensorMeta& out = n.outputs(0).meta();
      if (!SameLayout(out, y)) break;
      bool ok = n.args(0).kind_case() == Argument::kValue &&
                n.args(1).kind_case() == Argument::kValue && n.args(0).name().empty() &&
                n.args(1).name().empty();
      if (n.args_size() == 3) ok = ok && IsUnitScalar(n.args(2));  // alpha
      if (n.args_size() > 3 || !ok) break;
      const uint32_t a = n.args(0).value(), b = n.args(1).value();
      if (a == b) break;
      const bool first = a == cur;
      const uint32_t c = first ? b : a;
      if (!PerChannel(c, y)) break;
      Link link{Link::kAdd, c, reader};
      if (n.op() == "aten::add.Tensor") {
        link.kind = Link::kAdd;
      } else if (n.op() == "aten::sub.Tensor" && first) {
        link.kind = Link::kSub;
      } else if (n.op() == "aten::mul.Tensor" && n.args_size() == 2) {
        link.kind = Link::kMul;
      } else {
        break;
      }
      chain.push_back(link);
      cur = n.outputs(0).id();
    }
    return chain;
  }

  uint32_t Emit(std::vector<Node>& nodes, const std::string& op,
                const std::vector<uint32_t>& tensor_args, const std::vector<int64_t>& sizes,
                const std::vector<int64_t>* view_sizes, const TensorMeta& like,
                const std::vector<int64_t>* strides = nullptr) {
    const uint32_t id = EmitNode(nodes, index_, op, tensor_args, sizes, view_sizes, like, strides);
    emitted_[id] = nodes.back().outputs(0).meta();
    return id;
  }

  std::vector<Node> Fold(const Node& conv, const std::vector<Link>& chain) {
    std::vector<Node> nodes;
    const TensorMeta& y = conv.outputs(0).meta();
    const int64_t channels = y.sizes(1);
    const std::vector<int64_t> vec{channels};
    // scale and shift as [C] vectors: chain(y) = y * scale + shift
    std::optional<uint32_t> scale, shift;
    for (const Link& link : chain) {
      const std::vector<int64_t> stride{ChannelStride(Meta(link.operand))};
      const uint32_t c = Emit(nodes, "aten::view", {link.operand}, vec, &vec, y, &stride);
      switch (link.kind) {
        case Link::kAdd:
          shift = shift ? Emit(nodes, "aten::add.Tensor", {*shift, c}, vec, nullptr, y) : c;
          break;
        case Link::kSub:
          shift = shift ? Emit(nodes, "aten::sub.Tensor", {*shift, c}, vec, nullptr, y)
                        : Emit(nodes, "aten::neg", {c}, vec, nullptr, y);
          break;
        case Link::kMul:
          scale = scale ? Emit(nodes, "aten::mul.Tensor", {*scale, c}, vec, nullptr, y) : c;
          if (shift) shift = Emit(nodes, "aten::mul.Tensor", {*shift, c}, vec, nullptr, y);
          break;
      }
    }
    Node folded = conv;
    const uint32_t w = conv.args(1).value();
    if (scale) {
      const TensorMeta& wm = Meta(w);
      const std::vector<int64_t> wsizes = Sizes(wm);
      const std::vector<int64_t> column{channels, 1, 1, 1};
      const std::vector<int64_t> column_strides{ChannelStride(Meta(*scale)), 1, 1, 1};
      const uint32_t s4 = Emit(nodes, "aten::view", {*scale}, column, &column, y, &column_strides);
      const std::vector<int64_t> wstrides(wm.strides().begin(), wm.strides().end());
      folded.mutable_args(1)->set_value(
          Emit(nodes, "aten::mul.Tensor", {w, s4}, wsizes, nullptr, wm, &wstrides));
    }
    std::optional<uint32_t> bias;
    if (conv.args(2).kind_case() == Argument::kValue) {
      const uint32_t b = conv.args(2).value();
      bias = scale ? Emit(nodes, "aten::mul.Tensor", {b, *scale}, vec, nullptr, y) : b;
    }
    if (shift) {
      bias = bias ? Emit(nodes, "aten::add.Tensor", {*bias, *shift}, vec, nullptr, y) : *shift;
    }
    if (bias) folded.mutable_args(2)->set_value(*bias);
    *folded.mutable_outputs(0) = graph_.nodes(chain.back().node).outputs(0);
    nodes.push_back(std::move(folded));
    return nodes;
  }

  const Graph& graph_;
  ValueIndex index_;
  SoleReaders sole_;
  std::unordered_set<uint32_t> bound_;
  std::unordered_map<uint32_t, TensorMeta> emitted_;  // metadata of the values Fold adds
  PassStats* stats_;
};

}  // namespace

Graph DecomposeBatchNormEval(const Graph& graph) {
  ValueIndex index = IndexValues(graph);
  std::unordered_set<uint32_t> read(graph.outputs().begin(), graph.outputs().end());
  for (const Node& n : graph.nodes()) {
    for (uint32_t id : ValuesRead(n)) read.insert(id);
  }
  std::unordered_map<int, std::vector<Node>> replace;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& bn = graph.nodes(i);
    if (bn.op() != "aten::_native_batch_norm_legit_no_training" || bn.args_size() != 7 ||
        bn.outputs_size() != 3 || read.count(bn.outputs(1).id()) ||
        read.count(bn.outputs(2).id())) {
      continue;
    }
    bool positional = true;
    for (const Argument& a : bn.args()) positional = positional && a.name().empty();
    const Argument &x = bn.args(0), &w = bn.args(1), &b = bn.args(2), &mean = bn.args(3),
                   &var = bn.args(4), &eps = bn.args(6);
    auto optional_tensor = [](const Argument& a) {
      return a.kind_case() == Argument::kValue || a.kind_case() == Argument::kNone;
    };
    if (!positional || x.kind_case() != Argument::kValue || mean.kind_case() != Argument::kValue ||
        var.kind_case() != Argument::kValue || !optional_tensor(w) || !optional_tensor(b) ||
        eps.kind_case() != Argument::kFloatValue) {
      continue;
    }
    const TensorMeta& y = bn.outputs(0).meta();
    // Every operand a value defined earlier (a validated graph's are; anything else is left to
    // ATen's kernel, which refuses it clearly).
    auto known = [&](const Argument& a) {
      return a.kind_case() != Argument::kValue || index.meta.count(a.value()) != 0;
    };
    if (!known(x) || !known(w) || !known(b) || !known(mean) || !known(var)) continue;
    const TensorMeta& xm = *index.meta.at(x.value());
    if (y.sizes_size() < 2 || xm.dtype() != y.dtype() || !IsFloatingDType(y.dtype()) ||
        xm.sizes_size() != y.sizes_size()) {
      continue;
    }
    const int64_t channels = y.sizes(1);
    bool params_ok = true;
    for (const Argument* p : {&w, &b, &mean, &var}) {
      if (p->kind_case() != Argument::kValue) continue;
      const TensorMeta& pm = *index.meta.at(p->value());
      params_ok = params_ok && pm.sizes_size() == 1 && pm.sizes(0) == channels &&
                  IsFloatingDType(pm.dtype());
    }
    if (!params_ok) continue;
    const kiln::v1::DType compute =
        y.dtype() == kiln::v1::DTYPE_BFLOAT16 || y.dtype() == kiln::v1::DTYPE_FLOAT16
            ? kiln::v1::DTYPE_FLOAT32
            : y.dtype();
    std::vector<Node> nodes;
    // A node over `args` defining a value of `like`'s sizes, strides and device in `dtype`; then
    // `extra` (a scalar or named argument) after the tensors.
    auto emit = [&](const std::string& op, const std::vector<uint32_t>& args,
                    const TensorMeta& like, kiln::v1::DType dtype,
                    const std::optional<Argument>& extra = std::nullopt) {
      TensorMeta m = like;
      m.set_dtype(dtype);
      const std::vector<int64_t> strides = Strides(like);
      const uint32_t id = EmitNode(nodes, index, op, args, Sizes(like), nullptr, m, &strides);
      if (extra) *nodes.back().add_args() = *extra;
      return id;
    };
    auto cast = [&](uint32_t id, const TensorMeta& m, kiln::v1::DType to) {
      if (m.dtype() == to) return id;
      Argument dtype;
      dtype.set_name("dtype");
      dtype.set_dtype_value(to);
      return emit("aten::_to_copy", {id}, m, to, dtype);
    };
    std::vector<int64_t> column(y.sizes_size(), 1);
    column[1] = channels;
    const std::vector<int64_t> column_strides = ContiguousStrides(column);
    auto as_column = [&](uint32_t id, const TensorMeta& like) {  // [C] viewed as [1, C, 1, ...]
      return EmitNode(nodes, index, "aten::view", {id}, column, &column, like, &column_strides);
    };
    auto per_channel = [&](uint32_t id) {  // in the compute dtype
      const TensorMeta& m = *index.meta.at(id);
      TensorMeta like = m;
      like.set_dtype(compute);
      return as_column(cast(id, m, compute), like);
    };
    auto binary = [&](const std::string& op, uint32_t a, uint32_t c) {
      return emit(op, {a, c}, y, compute);
    };
    const TensorMeta& vm = *index.meta.at(var.value());
    Argument eps_arg;
    eps_arg.set_float_value(eps.float_value());
    const uint32_t shifted =
        emit("aten::add.Scalar", {cast(var.value(), vm, compute)}, vm, compute, eps_arg);
    const uint32_t inv = emit("aten::rsqrt", {shifted}, vm, compute);
    TensorMeta vector = vm;
    vector.set_dtype(compute);
    uint32_t out =
        binary("aten::sub.Tensor", cast(x.value(), xm, compute), per_channel(mean.value()));
    out = binary("aten::mul.Tensor", out, as_column(inv, vector));
    if (w.kind_case() == Argument::kValue) {
      out = binary("aten::mul.Tensor", out, per_channel(w.value()));
    }
    if (b.kind_case() == Argument::kValue) {
      out = binary("aten::add.Tensor", out, per_channel(b.value()));
    }
    TensorMeta computed = y;
    computed.set_dtype(compute);
    cast(out, computed, y.dtype());
    // The last node defines the batch norm's result.
    *nodes.back().mutable_outputs(0) = bn.outputs(0);
    replace[i] = std::move(nodes);
  }
  return ReplaceNodes(graph, std::move(replace));
}

Graph FoldConvolutionAffine(const Graph& graph, PassStats* stats) {
  return Folder(graph, stats).Run();
}

Graph ConvolutionBiasAsEpilogue(const Graph& graph, PassStats* stats) {
  ValueIndex index = IndexValues(graph);
  std::unordered_map<int, std::vector<Node>> replace;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& conv = graph.nodes(i);
    if (conv.op() != "aten::convolution" || conv.args_size() != 9 || conv.outputs_size() != 1 ||
        conv.args(2).kind_case() != Argument::kValue || !conv.args(2).name().empty()) {
      continue;
    }
    const TensorMeta& y = conv.outputs(0).meta();
    const uint32_t b = conv.args(2).value();
    const TensorMeta& bm = *index.meta.at(b);
    if (y.sizes_size() < 3 || bm.sizes_size() != 1 || bm.sizes(0) != y.sizes(1) ||
        bm.dtype() != y.dtype() || (bm.sizes(0) > 1 && bm.strides(0) != 1)) {
      continue;
    }
    std::vector<int64_t> column(y.sizes_size(), 1);
    column[1] = y.sizes(1);
    std::vector<Node> nodes;
    const uint32_t bias_column = EmitNode(nodes, index, "aten::view", {b}, column, &column, bm);
    Node bare = conv;
    bare.mutable_args(2)->mutable_none();
    bare.mutable_outputs(0)->set_id(index.next_id++);
    Node add;
    add.set_op("aten::add.Tensor");
    add.add_args()->set_value(bare.outputs(0).id());
    add.add_args()->set_value(bias_column);
    *add.add_outputs() = conv.outputs(0);
    nodes.push_back(std::move(bare));
    nodes.push_back(std::move(add));
    replace[i] = std::move(nodes);
    if (stats) ++stats->convolution_bias_epilogues;
  }
  return ReplaceNodes(graph, std::move(replace));
}

Graph DepthwiseWeightsChannelsInnermost(const Graph& graph) {
  ValueIndex index = IndexValues(graph);
  const std::unordered_set<uint32_t> bound = BoundValues(graph);
  const auto& meta = index.meta;
  std::unordered_map<int, std::vector<Node>> replace;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const Node& conv = graph.nodes(i);
    std::optional<WindowConvolution> c =
        MatchDepthwiseConvolution(conv, meta, kiln::v1::DEVICE_KIND_CUDA);
    if (!c || !bound.count(c->weight)) continue;
    const TensorMeta& wm = *meta.at(c->weight);
    const int64_t channels = wm.sizes(0), kh = wm.sizes(2), kw = wm.sizes(3);
    if (channels < 2 || kh * kw < 2 || wm.strides(0) == 1) continue;
    // [C, 1, KH, KW] -> [KH, KW, C, 1] (a view), copied row-major, viewed back.
    const std::vector<int64_t> dims{2, 3, 0, 1};
    const std::vector<int64_t> t_sizes{kh, kw, channels, 1};
    const std::vector<int64_t> t_strides{wm.strides(2), wm.strides(3), wm.strides(0),
                                         wm.strides(1)};
    const std::vector<int64_t> w_sizes{channels, 1, kh, kw};
    const std::vector<int64_t> w_strides{1, 1, kw * channels, channels};
    std::vector<Node> nodes;
    const uint32_t t =
        EmitNode(nodes, index, "aten::permute", {c->weight}, t_sizes, &dims, wm, &t_strides);
    const uint32_t copy = EmitNode(nodes, index, "aten::clone", {t}, t_sizes, nullptr, wm);
    const uint32_t w =
        EmitNode(nodes, index, "aten::permute", {copy}, w_sizes, &dims, wm, &w_strides);
    Node rewritten = conv;
    rewritten.mutable_args(1)->set_value(w);
    nodes.push_back(std::move(rewritten));
    replace[i] = std::move(nodes);
  }
  return ReplaceNodes(graph, std::move(replace));
}

}  // namespace kiln::compiler
