// Size expressions for hand-built graphs with size symbols: one-term SymExprs and metadata whose
// sizes are expressions with row-major strides over them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "compiler/ir/sym_expr.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::testing {

using kiln::v1::SymExpr;

// c * symbols..., one term (c 0: no terms).
inline SymExpr Term(int64_t c, std::vector<uint32_t> symbols = {}) {
  SymExpr e;
  if (c == 0) return e;
  auto* t = e.add_terms();
  t->set_coefficient(c);
  for (uint32_t s : symbols) t->add_symbols(s);
  return e;
}

// Sets value meta `m` to sizes `exprs` with row-major strides over them (products of the
// sizes after each dim: single terms here, so the product of terms is one term).
inline void SetSymbolic(kiln::v1::TensorMeta* m, const std::vector<SymExpr>& exprs) {
  m->clear_sizes();
  m->clear_strides();
  m->clear_size_exprs();
  m->clear_stride_exprs();
  std::vector<SymExpr> strides(exprs.size());
  SymExpr stride = Term(1);
  for (int d = static_cast<int>(exprs.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    const auto& a = stride.terms(0);
    const auto& b = exprs[d].terms(0);
    std::vector<uint32_t> symbols(a.symbols().begin(), a.symbols().end());
    symbols.insert(symbols.end(), b.symbols().begin(), b.symbols().end());
    std::sort(symbols.begin(), symbols.end());
    stride = Term(a.coefficient() * b.coefficient(), symbols);
  }
  for (size_t d = 0; d < exprs.size(); ++d) {
    *m->add_size_exprs() = exprs[d];
    *m->add_stride_exprs() = strides[d];
    const auto size = kiln::compiler::ConstantOf(exprs[d]);
    const auto step = kiln::compiler::ConstantOf(strides[d]);
    m->add_sizes(size ? *size : -1);
    m->add_strides(step ? *step : 0);
  }
}

// Declares size symbols 0 .. count - 1, symbol d the size of input `input`'s dim d, each >= min.
inline void AddSizeSymbols(kiln::v1::Graph* g, uint32_t input, uint32_t count, int64_t min) {
  for (uint32_t id = 0; id < count; ++id) {
    auto* s = g->add_size_symbols();
    s->set_id(id);
    s->set_input(input);
    s->set_dim(id);
    s->set_min(min);
  }
}

}  // namespace kiln::testing
