// FuseSymbolicGraph: fuse at representative sizes, check each group on the size expressions,
// merge its symbolic dims into one runtime extent, fuse again without the groups that fail.
#include "compiler/passes/symbolic_fusion.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "compiler/ir/graph_index.h"
#include "compiler/ir/op_classes.h"
#include "compiler/ir/pointwise_ops.h"
#include "compiler/ir/reduction_ops.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/passes/fusion.h"

namespace kiln::compiler {
namespace {

using kiln::v1::Graph;
using kiln::v1::SymExpr;
using kiln::v1::TensorMeta;
using Exprs = std::vector<SymExpr>;
using MetaMap = std::unordered_map<uint32_t, const TensorMeta*>;
using SymbolValues = std::unordered_map<uint32_t, int64_t>;

// The representative value of the k-th symbol: odd, distinct, large enough that a row-wise group
// over symbolic rows is fused as it would be for a real batch, within the symbol's range.
constexpr int64_t kFirstRepresentative = 67;

SymbolValues Representatives(const Graph& graph) {
  SymbolValues values;
  int64_t next = kFirstRepresentative;
  for (const kiln::v1::SizeSymbol& s : graph.size_symbols()) {
    int64_t v = std::max<int64_t>(next, s.min());
    if (s.max() > 0) v = std::min<int64_t>(v, s.max());
    values[s.id()] = v;
    next += 2;
  }
  return values;
}

Exprs SizeExprs(const TensorMeta& m) {
  if (IsSymbolic(m)) return {m.size_exprs().begin(), m.size_exprs().end()};
  Exprs e;
  for (int64_t s : m.sizes()) e.push_back(SymConstant(s));
  return e;
}

Exprs StrideExprs(const TensorMeta& m) {
  if (IsSymbolic(m)) return {m.stride_exprs().begin(), m.stride_exprs().end()};
  Exprs e;
  for (int64_t s : m.strides()) e.push_back(SymConstant(s));
  return e;
}

bool Same(const Exprs& a, const Exprs& b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d) {
    if (!SymEqual(a[d], b[d])) return false;
  }
  return true;
}

bool IsOne(const SymExpr& e) { return ConstantOf(e) == std::optional<int64_t>(1); }

// `m` at the representative sizes; false when a size or stride overflows there.
bool Represent(TensorMeta& m, const SymbolValues& values) {
  if (!IsSymbolic(m)) return true;
  for (int d = 0; d < m.sizes_size(); ++d) {
    const std::optional<int64_t> size = SymEvaluate(m.size_exprs(d), values);
    const std::optional<int64_t> stride = SymEvaluate(m.stride_exprs(d), values);
    if (!size || !stride || *size < 0 || *stride < 0) return false;
    m.set_sizes(d, *size);
    m.set_strides(d, *stride);
  }
  if (m.has_storage_offset_expr()) {
    const std::optional<int64_t> offset = SymEvaluate(m.storage_offset_expr(), values);
    if (!offset || *offset < 0) return false;
    m.set_storage_offset(*offset);
    m.clear_storage_offset_expr();
  }
  m.clear_size_exprs();
  m.clear_stride_exprs();
  return true;
}

// The storage offset of `m` as an expression.
SymExpr OffsetExpr(const TensorMeta& m) {
  return m.has_storage_offset_expr() ? m.storage_offset_expr() : SymConstant(m.storage_offset());
}

std::unique_ptr<Graph> RepresentativeGraph(const Graph& graph, const SymbolValues& values) {
  auto out = std::make_unique<Graph>(graph);
  for (auto& v : *out->mutable_inputs()) {
    if (!Represent(*v.mutable_meta(), values)) return nullptr;
  }
  for (auto& n : *out->mutable_nodes()) {
    for (auto& o : *n.mutable_outputs()) {
      if (!Represent(*o.mutable_meta(), values)) return nullptr;
    }
  }
  return out;
}

// Every value's metadata, to rewrite (IndexValues' meta, mutable).
std::unordered_map<uint32_t, TensorMeta*> MutableMetas(Graph& graph) {
  std::unordered_map<uint32_t, TensorMeta*> meta;
  for (auto& v : *graph.mutable_inputs()) meta[v.id()] = v.mutable_meta();
  for (auto& c : *graph.mutable_constants()) meta[c.value().id()] = c.mutable_value()->mutable_meta();
  for (auto& n : *graph.mutable_nodes()) {
    for (auto& o : *n.mutable_outputs()) meta[o.id()] = o.mutable_meta();
  }
  return meta;
}

// Row-major for every value of the symbols: each dim's stride the next (non-unit) dim's stride
// times its size, the last one's 1.
bool RowMajorForAll(const TensorMeta& m) {
  const Exprs sizes = SizeExprs(m), strides = StrideExprs(m);
  SymExpr expected = SymConstant(1);
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    if (IsOne(sizes[d])) continue;
    if (!SymEqual(strides[d], expected)) return false;
    std::optional<SymExpr> next = SymProduct(expected, sizes[d]);
    if (!next) return false;
    expected = *std::move(next);
  }
  return true;
}

// What a group becomes: its space's dims in loop order, the leading `merged` of them one extent
// (`outer`, `outer_value` at the representative sizes), and each access's strides over
// [outer, order[merged:]...] (without the outer entry when merged is 0).
struct Merge {
  std::vector<int> order;
  int merged = 0;
  SymExpr outer;
  int64_t outer_value = 1;
  std::vector<std::vector<int64_t>> input_strides;  // per FusedGroup::inputs entry
  std::unordered_map<uint32_t, std::vector<int64_t>> output_strides;
};

class GroupCheck {
 public:
  GroupCheck(const Graph& graph, const Graph& represented, const MetaMap& meta,
             const MetaMap& represented_meta, const std::unordered_map<uint32_t, int>& producer,
             kiln::v1::DeviceKind device)
      : graph_(graph),
        represented_(represented),
        meta_(meta),
        rmeta_(represented_meta),
        producer_(producer),
        device_(device) {}

  // How group `g` becomes a kernel with a runtime outer extent (merged 0: static as fused), or
  // nullopt when what the fuser decided at the representative sizes does not hold for all;
  // then blame() names the nodes that made it fail (all of the group's when no node alone did).
  std::optional<Merge> Check(const FusedGroup& g) {
    g_ = &g;
    blame_.clear();
    rank_ = static_cast<int>(g.sizes.size());
    outer_ = g.outer_rank;
    if (!Space() || !NodesOverSpace()) return std::nullopt;
    Merge m;
    m.order.resize(rank_);
    std::iota(m.order.begin(), m.order.end(), 0);
    if (outer_ < 0 && !g.outputs.empty()) {
      // The loop order the generators choose: the first output's memory order.
      const TensorMeta& first = *rmeta_.at(g.outputs[0]);
      if (first.sizes_size() == rank_) {
        std::stable_sort(m.order.begin(), m.order.end(), [&](int a, int b) {
          auto key = [&](int d) { return first.sizes(d) == 1 ? 0 : first.strides(d); };
          return key(a) > key(b);
        });
      }
    }
    for (int p = 0; p < rank_; ++p) {
      if (!ConstantOf(space_[m.order[p]])) m.merged = p + 1;
    }
    if (g.convolution >= 0 && m.merged > 0) return std::nullopt;
    if (outer_ >= 0 && m.merged > outer_) return std::nullopt;
    m.outer = SymConstant(1);
    for (int p = 0; p < m.merged; ++p) {
      const int d = m.order[p];
      if (IsOne(space_[d])) continue;
      merged_dims_.push_back(d);
      std::optional<SymExpr> product = SymProduct(m.outer, space_[d]);
      if (!product) return std::nullopt;
      m.outer = *std::move(product);
      m.outer_value *= g.sizes[d];
    }
    if (m.merged > 0 && m.outer_value < 2) return std::nullopt;
    order_ = m.order;
    merged_ = m.merged;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      std::optional<std::vector<int64_t>> s;
      if (g.inputs[i].literal) {
        s = std::vector<int64_t>(rank_ - m.merged + (m.merged > 0), 0);
      } else if (FoldsForAll(g.input_ids[i])) {
        s = Merged(Over(*meta_.at(g.input_ids[i]), false));
      }
      if (!s) return Blame(ReadersOf(g.input_ids[i]));
      m.input_strides.push_back(*std::move(s));
    }
    for (uint32_t id : g.outputs) {
      const TensorMeta& om = *meta_.at(id);
      const bool rows_only = outer_ >= 0 && om.sizes_size() == outer_ && outer_ != rank_;
      std::optional<std::vector<int64_t>> s = Merged(Over(om, rows_only));
      if (!s) return Blame({producer_.at(id)});
      if (rows_only) s->resize(outer_ - m.merged + (m.merged > 0));
      m.output_strides[id] = *std::move(s);
    }
    if (m.merged > 0 && outer_ < 0 && !g.outputs.empty()) {
      // The generators' loop order keeps the merged extent outermost.
      const std::vector<int64_t>& first = m.output_strides.at(g.outputs[0]);
      for (size_t d = 1; d < first.size(); ++d) {
        if (first[d] > first[0]) return std::nullopt;
      }
    }
    return m;
  }

  const std::vector<int>& blame() const { return blame_.empty() ? g_->nodes : blame_; }

 private:
  std::nullopt_t Blame(std::vector<int> nodes) {
    blame_ = std::move(nodes);
    return std::nullopt;
  }

  // The group's nodes that read `id`.
  std::vector<int> ReadersOf(uint32_t id) const {
    std::vector<int> out;
    for (int ni : g_->nodes) {
      const std::vector<uint32_t> read = ValuesRead(graph_.nodes(ni));
      if (std::find(read.begin(), read.end(), id) != read.end()) out.push_back(ni);
    }
    return out;
  }

  // The space's sizes as expressions: those of a value of the group over its whole space.
  bool Space() {
    space_.clear();
    merged_dims_.clear();
    auto consider = [&](uint32_t id) {
      if (space_.empty() && Sizes(*rmeta_.at(id)) == g_->sizes) space_ = SizeExprs(*meta_.at(id));
    };
    for (int ni : g_->nodes) {
      for (const auto& out : represented_.nodes(ni).outputs()) consider(out.id());
      if (auto r = MatchReduction(represented_.nodes(ni), rmeta_, device_)) consider(r->input);
    }
    if (space_.size() != static_cast<size_t>(rank_)) return false;
    rows_.assign(space_.begin(), space_.begin() + std::max(outer_, 0));
    kept_ = rows_;
    rows_.resize(rank_, SymConstant(1));
    return true;
  }

  // Every node's results over the space, its rows, or (a reduction without keepdim) the kept
  // dims; every pointwise operand broadcasting to its node's result; every reduction over the
  // whole space with static reduced dims.
  bool NodesOverSpace() {
    for (int ni : g_->nodes) {
      if (!NodeOverSpace(ni)) {
        blame_ = {ni};
        return false;
      }
    }
    return true;
  }

  bool NodeOverSpace(int ni) const {
    const kiln::v1::Node& node = graph_.nodes(ni);
    if (auto r = MatchReduction(represented_.nodes(ni), rmeta_, device_)) {
      if (!Same(SizeExprs(*meta_.at(r->input)), space_)) return false;
      for (int d = std::max(outer_, 0); d < rank_; ++d) {
        if (!ConstantOf(space_[d])) return false;
      }
    }
    for (const auto& out : node.outputs()) {
      const Exprs s = SizeExprs(out.meta());
      if (!Same(s, space_) && !(outer_ >= 0 && (Same(s, rows_) || Same(s, kept_)))) return false;
    }
    if (FindPointwise(node.op()) == nullptr) return true;
    const Exprs o = SizeExprs(node.outputs(0).meta());
    for (uint32_t id : ValuesRead(node)) {
      const Exprs a = SizeExprs(*meta_.at(id));
      if (a.size() > o.size()) return false;
      for (size_t d = 0; d < a.size(); ++d) {
        if (!IsOne(a[d]) && !SymEqual(a[d], o[o.size() - a.size() + d])) return false;
      }
    }
    return true;
  }

  // Whether the fuser's folding of the views that define `id` holds for every value of the
  // symbols: a reshape-like view only folds where its input and result are row-major for all,
  // and the view's storage offset is the base's plus a constant for all (the kernel reads the
  // base at the offset the representative sizes give; a slice at a symbolic position is read as
  // the view the library step makes).
  bool FoldsForAll(uint32_t id) const {
    uint32_t base = id;
    auto offset_holds = [&] {
      const TensorMeta& view = *meta_.at(id);
      const TensorMeta& from = *meta_.at(base);
      if (!view.has_storage_offset_expr() && !from.has_storage_offset_expr()) return true;
      return SymEqual(OffsetExpr(view), OffsetExpr(from));
    };
    while (true) {
      auto p = producer_.find(base);
      if (p == producer_.end()) return offset_holds();
      const kiln::v1::Node& rn = represented_.nodes(p->second);
      if (!FoldableView(rn, rmeta_)) return offset_holds();
      if (!IsAlwaysView(rn.op())) {
        const kiln::v1::Node& n = graph_.nodes(p->second);
        if (!RowMajorForAll(*meta_.at(n.args(0).value())) ||
            !RowMajorForAll(n.outputs(0).meta())) {
          return false;
        }
      }
      base = rn.args(0).value();
    }
  }

  // The strides of a value over the space: broadcast (aligned to the last dim, 0 where its
  // size is 1), or with `left` its dims the space's leading ones (a row value without keepdim).
  Exprs Over(const TensorMeta& m, bool left) const {
    const Exprs sizes = SizeExprs(m), strides = StrideExprs(m);
    Exprs out(rank_, SymConstant(0));
    const int r = static_cast<int>(sizes.size());
    const int shift = left ? 0 : rank_ - r;
    for (int d = 0; d < r && shift + d < rank_; ++d) {
      if (!IsOne(sizes[d])) out[shift + d] = strides[d];
    }
    return out;
  }

  // `strides` over the merged space, or nullopt when the merged dims are not one block this
  // access walks with a static stride (or broadcasts), or another stride is symbolic.
  std::optional<std::vector<int64_t>> Merged(const Exprs& strides) const {
    std::vector<int64_t> out;
    if (merged_ > 0) {
      for (size_t j = 0; j + 1 < merged_dims_.size(); ++j) {
        const int d = merged_dims_[j], next = merged_dims_[j + 1];
        std::optional<SymExpr> walked = SymProduct(strides[next], space_[next]);
        if (!walked || !SymEqual(strides[d], *walked)) return std::nullopt;
      }
      const std::optional<int64_t> last = ConstantOf(strides[merged_dims_.back()]);
      if (!last) return std::nullopt;
      out.push_back(*last);
    }
    for (int p = merged_; p < rank_; ++p) {
      const std::optional<int64_t> s = ConstantOf(strides[order_[p]]);
      if (!s) return std::nullopt;
      out.push_back(*s);
    }
    return out;
  }

  const Graph& graph_;
  const Graph& represented_;
  const MetaMap& meta_;
  const MetaMap& rmeta_;
  const std::unordered_map<uint32_t, int>& producer_;
  const kiln::v1::DeviceKind device_;
  const FusedGroup* g_ = nullptr;
  int rank_ = 0, outer_ = -1, merged_ = 0;
  Exprs space_, rows_, kept_;  // the space; its rows (keepdim); its kept dims
  std::vector<int> order_, merged_dims_;
  std::vector<int> blame_;  // the nodes that made the last Check fail
};

// Meta `m`, given sizes and strides; false when an earlier group gave the value others.
bool SetMeta(TensorMeta& m, std::vector<int64_t> sizes, const std::vector<int64_t>& strides,
             std::unordered_map<uint32_t, std::vector<int64_t>>& set, uint32_t id) {
  std::vector<int64_t> key = sizes;
  key.insert(key.end(), strides.begin(), strides.end());
  auto [it, fresh] = set.emplace(id, key);
  if (!fresh) return it->second == key;
  m.clear_sizes();
  m.clear_strides();
  for (int64_t s : sizes) m.add_sizes(s);
  for (int64_t s : strides) m.add_strides(s);
  return true;
}

// Group `g` of `program` made a kernel over [outer, ...] per `merge`, its values' metadata in
// `kernels` (`kmeta`) rewritten to match; false on a conflict with another group's rewriting.
bool Apply(const Merge& merge, FusedGroup& g, Graph& kernels,
           std::unordered_map<uint32_t, TensorMeta*>& kmeta, const MetaMap& meta,
           const MetaMap& rmeta, kiln::v1::DeviceKind device,
           std::unordered_map<uint32_t, std::vector<int64_t>>& set) {
  if (merge.merged == 0) return true;
  const int rank = static_cast<int>(g.sizes.size());
  const int outer = g.outer_rank;
  std::vector<int64_t> sizes{merge.outer_value};
  for (int p = merge.merged; p < rank; ++p) sizes.push_back(g.sizes[merge.order[p]]);
  std::vector<int64_t> rows(sizes.size(), 1), kept;
  if (outer >= 0) {
    const int new_outer = outer - merge.merged + 1;
    std::copy(sizes.begin(), sizes.begin() + new_outer, rows.begin());
    kept.assign(sizes.begin(), sizes.begin() + new_outer);
  }
  std::unordered_set<uint32_t> reduced;  // what the group's reductions read
  for (int ni : g.nodes) {
    kiln::v1::Node& node = *kernels.mutable_nodes(ni);
    if (auto r = MatchReduction(node, rmeta, device)) {
      if (!DimsFromEnd(node, rmeta.at(r->input)->sizes_size())) return false;
      reduced.insert(r->input);
    }
    for (auto& out : *node.mutable_outputs()) {
      const TensorMeta& original = *meta.at(out.id());
      const std::vector<int64_t>* shape = &sizes;
      if (outer >= 0 && Sizes(*rmeta.at(out.id())) != g.sizes) {
        shape = original.sizes_size() == outer && outer != rank ? &kept : &rows;
      }
      auto stored = merge.output_strides.find(out.id());
      const std::vector<int64_t> strides =
          stored != merge.output_strides.end() ? stored->second : ContiguousStrides(*shape);
      if (!SetMeta(*out.mutable_meta(), *shape, strides, set, out.id())) return false;
    }
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    g.inputs[i].strides = merge.input_strides[i];
    // A reduction reading a group input sees it over the merged space.
    const uint32_t id = g.input_ids[i];
    if (reduced.count(id) && !SetMeta(*kmeta.at(id), sizes, merge.input_strides[i], set, id)) {
      return false;
    }
  }
  g.sizes = sizes;
  if (outer >= 0) g.outer_rank = outer - merge.merged + 1;
  g.runtime_outer = merge.outer;
  return true;
}

}  // namespace

std::optional<SymbolicFusion> FuseSymbolicGraph(const Graph& graph,
                                                const std::unordered_set<uint32_t>* bound,
                                                kiln::v1::DeviceKind device) {
  const SymbolValues values = Representatives(graph);
  std::unique_ptr<Graph> represented = RepresentativeGraph(graph, values);
  if (!represented) return std::nullopt;
  const ValueIndex index = IndexValues(graph);
  const MetaMap rmeta = IndexValues(*represented).meta;
  GroupCheck check(graph, *represented, index.meta, rmeta, index.producer, device);
  std::unordered_set<int> library;
  while (true) {
    FusedProgram program = FuseGraph(*represented, bound, device, &library);
    auto kernels = std::make_unique<Graph>(*represented);
    auto kmeta = MutableMetas(*kernels);
    std::unordered_map<uint32_t, std::vector<int64_t>> set;
    bool refuse = false;
    for (FusedGroup& g : program.groups) {
      std::optional<Merge> merge = check.Check(g);
      if (merge && Apply(*merge, g, *kernels, kmeta, index.meta, rmeta, device, set)) continue;
      const std::vector<int>& blamed = merge ? g.nodes : check.blame();
      library.insert(blamed.begin(), blamed.end());
      refuse = true;
    }
    if (refuse) continue;
    program.meta = IndexValues(*kernels).meta;
    return SymbolicFusion{std::move(kernels), std::move(program)};
  }
}

}  // namespace kiln::compiler
