// Size expressions of graphs with size symbols (kiln.v1.SymExpr, Graph.size_symbols): the checks
// the validator makes of their canonical form, and what the compiler reads of them. Two
// canonical expressions are equal for every value of the symbols exactly when their messages
// are equal, so the compiler compares sizes by comparing messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// "" when `e` is canonical (graph.proto's SymExpr) over `symbols`, else why it is not.
std::string SymExprProblem(const kiln::v1::SymExpr& e, const std::unordered_set<uint32_t>& symbols);

// The value of `e` when no term names a symbol (0 for no terms); nullopt otherwise.
std::optional<int64_t> ConstantOf(const kiln::v1::SymExpr& e);

// Whether `e` is exactly one symbol (coefficient 1, power 1); that symbol in `*symbol`.
bool IsSymbol(const kiln::v1::SymExpr& e, uint32_t* symbol);

// The canonical expression of constant `c` (no terms for 0).
kiln::v1::SymExpr SymConstant(int64_t c);

// The canonical product of canonical `a` and `b`; nullopt when a coefficient overflows int64_t.
std::optional<kiln::v1::SymExpr> SymProduct(const kiln::v1::SymExpr& a, const kiln::v1::SymExpr& b);

// Whether canonical `a` and `b` are equal for every value of the symbols.
bool SymEqual(const kiln::v1::SymExpr& a, const kiln::v1::SymExpr& b);

// The value of `e` with each symbol given by `values`; nullopt when one is missing or the value
// overflows int64_t.
std::optional<int64_t> SymEvaluate(const kiln::v1::SymExpr& e,
                                   const std::unordered_map<uint32_t, int64_t>& values);

// Whether the metadata has sizes, strides or a storage offset over symbols (size_exprs, or
// storage_offset_expr, set).
inline bool IsSymbolic(const kiln::v1::TensorMeta& meta) {
  return meta.size_exprs_size() > 0 || meta.has_storage_offset_expr();
}

// Whether the graph declares size symbols.
inline bool IsSymbolic(const kiln::v1::Graph& graph) { return graph.size_symbols_size() > 0; }

}  // namespace kiln::compiler
