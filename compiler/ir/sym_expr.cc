// SymExpr checks: terms sorted by their symbol lists, each list sorted and naming declared
// symbols, no zero coefficient, no list twice.
#include "compiler/ir/sym_expr.h"

#include <algorithm>
#include <map>
#include <vector>

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

kiln::v1::SymExpr SymConstant(int64_t c) {
  kiln::v1::SymExpr e;
  if (c != 0) e.add_terms()->set_coefficient(c);
  return e;
}

std::optional<kiln::v1::SymExpr> SymProduct(const kiln::v1::SymExpr& a,
                                            const kiln::v1::SymExpr& b) {
  // Symbol lists compare as canonical order sorts terms: lexicographically.
  std::map<std::vector<uint32_t>, int64_t> terms;
  for (const kiln::v1::SymTerm& x : a.terms()) {
    for (const kiln::v1::SymTerm& y : b.terms()) {
      std::vector<uint32_t> symbols(x.symbols().begin(), x.symbols().end());
      symbols.insert(symbols.end(), y.symbols().begin(), y.symbols().end());
      std::sort(symbols.begin(), symbols.end());
      int64_t c = 0;
      if (__builtin_mul_overflow(x.coefficient(), y.coefficient(), &c)) return std::nullopt;
      int64_t& sum = terms[symbols];
      if (__builtin_add_overflow(sum, c, &sum)) return std::nullopt;
    }
  }
  kiln::v1::SymExpr out;
  for (const auto& [symbols, c] : terms) {
    if (c == 0) continue;
    kiln::v1::SymTerm* t = out.add_terms();
    t->set_coefficient(c);
    for (uint32_t s : symbols) t->add_symbols(s);
  }
  return out;
}

bool SymEqual(const kiln::v1::SymExpr& a, const kiln::v1::SymExpr& b) {
  if (a.terms_size() != b.terms_size()) return false;
  for (int t = 0; t < a.terms_size(); ++t) {
    const kiln::v1::SymTerm &x = a.terms(t), &y = b.terms(t);
    if (x.coefficient() != y.coefficient() || x.symbols_size() != y.symbols_size() ||
        !std::equal(x.symbols().begin(), x.symbols().end(), y.symbols().begin())) {
      return false;
    }
  }
  return true;
}

std::optional<int64_t> SymEvaluate(const kiln::v1::SymExpr& e,
                                   const std::unordered_map<uint32_t, int64_t>& values) {
  int64_t sum = 0;
  for (const kiln::v1::SymTerm& t : e.terms()) {
    int64_t product = t.coefficient();
    for (uint32_t s : t.symbols()) {
      auto v = values.find(s);
      if (v == values.end() || __builtin_mul_overflow(product, v->second, &product)) {
        return std::nullopt;
      }
    }
    if (__builtin_add_overflow(sum, product, &sum)) return std::nullopt;
  }
  return sum;
}

}  // namespace kiln::compiler
