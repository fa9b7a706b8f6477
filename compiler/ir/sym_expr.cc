// SymExpr checks: terms sorted by their symbol lists, each list sorted and naming declared
// symbols, no zero coefficient, no list twice.
#include "compiler/ir/sym_expr.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::compiler {

// Terms of more symbols than this (a product of that many sizes) are refused: no size a program
// computes has them, and evaluation stays cheap.
constexpr int kMaxTermSymbols = 8;
constexpr int kMaxTerms = 32;

std::string SymExprProblem(const kiln::v1::SymExpr& e, const std::unordered_set<uint32_t>& symbols) {
  if (e.terms_size() > kMaxTerms) return absl::StrCat("more than ", kMaxTerms, " terms");
  for (int t = 0; t < e.terms_size(); ++t) {
    const kiln::v1::SymTerm& term = e.terms(t);
    if (term.coefficient() == 0) return "a term with coefficient 0";
    if (term.symbols_size() > kMaxTermSymbols) {
      return absl::StrCat("a term of more than ", kMaxTermSymbols, " symbols");
    }
    for (int i = 0; i < term.symbols_size(); ++i) {
      if (!symbols.count(term.symbols(i))) {
        return absl::StrCat("symbol ", term.symbols(i), " is not declared");
      }
      if (i > 0 && term.symbols(i) < term.symbols(i - 1)) return "a term's symbols are not sorted";
    }
    if (t > 0) {
      const auto& prev = e.terms(t - 1).symbols();
      if (!std::lexicographical_compare(prev.begin(), prev.end(), term.symbols().begin(),
                                        term.symbols().end())) {
        return "terms not sorted by their symbols, or two terms of the same symbols";
      }
    }
  }
  return "";
}

std::optional<int64_t> ConstantOf(const kiln::v1::SymExpr& e) {
  if (e.terms_size() == 0) return 0;
  if (e.terms_size() == 1 && e.terms(0).symbols_size() == 0) return e.terms(0).coefficient();
  return std::nullopt;
}

bool IsSymbol(const kiln::v1::SymExpr& e, uint32_t* symbol) {
  if (e.terms_size() != 1 || e.terms(0).coefficient() != 1 || e.terms(0).symbols_size() != 1) {
    return false;
  }
  *symbol = e.terms(0).symbols(0);
  return true;
}

}  // namespace kiln::compiler
