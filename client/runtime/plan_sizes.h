// PlanSizes: a plan's size symbols (kiln.v1.ExecutionPlan.size_symbols) and the expressions over
// them, checked once when the plan is built and evaluated per call: the symbols' values are read
// from the call's inputs and checked against their ranges, then every expression is a sum of
// products of them, each step checked for int64_t overflow. Plain C++ without torch, so that it
// builds and is tested beside the decoder.
#ifndef KILN_RUNTIME_PLAN_SIZES_H_
#define KILN_RUNTIME_PLAN_SIZES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/plan_spec.h"
#include "status.h"

namespace kiln::runtime {

// An expression whose symbols are positions in PlanSizes' values.
struct SizeExpr {
  struct Term {
    int64_t coefficient = 0;
    std::vector<int> symbols;
  };
  std::vector<Term> terms;
};

class PlanSizes {
 public:
  // Checks the symbols: ids unique, ranges well-formed, each bound to a dimension of an input in
  // `per_call_inputs` (value ids). More than kMaxSymbols is refused.
  static StatusOr<PlanSizes> Create(const std::vector<SizeSymbolSpec>& symbols,
                                    const std::vector<uint32_t>& per_call_inputs);
  static constexpr size_t kMaxSymbols = 64;

  bool empty() const { return symbols_.empty(); }
  size_t size() const { return symbols_.size(); }

  // `e` over positions; an error for a symbol the plan does not declare or a zero coefficient.
  StatusOr<SizeExpr> Compile(const SymExprSpec& e) const;

  // The symbols' values for a call: `size_of(input position in per_call_inputs, dim)` gives an
  // input's size along a dim (nullopt: the input has no such dim, or is undefined). Fails,
  // naming the symbol, for a missing dim or a value outside the symbol's range.
  StatusOr<std::vector<int64_t>> Bind(
      const std::function<std::optional<int64_t>(size_t input, uint32_t dim)>& size_of) const;

  // Values that satisfy every range (each symbol's min, but at least 2 where the range allows):
  // what example inputs are made for.
  std::vector<int64_t> ExampleValues() const;

  // `e` at `values`; an error on overflow.
  static StatusOr<int64_t> Evaluate(const SizeExpr& e, const std::vector<int64_t>& values);

 private:
  struct Symbol {
    uint32_t id = 0;
    size_t input = 0;  // position among the per-call inputs
    uint32_t dim = 0;
    int64_t min = 0, max = 0;
  };
  std::vector<Symbol> symbols_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PLAN_SIZES_H_
