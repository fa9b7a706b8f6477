// PlanSizes: symbol ids to positions once, values per call, expressions with checked arithmetic.
#include "runtime/plan_sizes.h"

#include <algorithm>
#include <string>

namespace kiln::runtime {

StatusOr<PlanSizes> PlanSizes::Create(const std::vector<SizeSymbolSpec>& symbols,
                                      const std::vector<uint32_t>& per_call_inputs) {
  if (symbols.size() > kMaxSymbols) {
    return Status::InvalidArgument("kiln plan: more than " + std::to_string(kMaxSymbols) +
                                   " size symbols");
  }
  PlanSizes sizes;
  for (const SizeSymbolSpec& s : symbols) {
    const std::string what = "kiln plan: size symbol " + std::to_string(s.id);
    for (const Symbol& other : sizes.symbols_) {
      if (other.id == s.id) return Status::InvalidArgument(what + " is declared twice");
    }
    auto input = std::find(per_call_inputs.begin(), per_call_inputs.end(), s.input);
    if (input == per_call_inputs.end()) {
      return Status::InvalidArgument(what + ": value " + std::to_string(s.input) +
                                     " is not a per-call input");
    }
    if (s.min < 0 || (s.max != 0 && s.max < s.min)) {
      return Status::InvalidArgument(what + ": malformed range");
    }
    sizes.symbols_.push_back(
        {s.id, static_cast<size_t>(input - per_call_inputs.begin()), s.dim, s.min, s.max});
  }
  return sizes;
}

StatusOr<SizeExpr> PlanSizes::Compile(const SymExprSpec& e) const {
  SizeExpr out;
  for (const SymTermSpec& t : e.terms) {
    if (t.coefficient == 0) return Status::InvalidArgument("a term with coefficient 0");
    SizeExpr::Term term{t.coefficient, {}};
    for (uint32_t id : t.symbols) {
      auto it = std::find_if(symbols_.begin(), symbols_.end(),
                             [&](const Symbol& s) { return s.id == id; });
      if (it == symbols_.end()) {
        return Status::InvalidArgument("symbol " + std::to_string(id) + " is not declared");
      }
      term.symbols.push_back(static_cast<int>(it - symbols_.begin()));
    }
    out.terms.push_back(std::move(term));
  }
  return out;
}

StatusOr<std::vector<int64_t>> PlanSizes::Bind(
    const std::function<std::optional<int64_t>(size_t input, uint32_t dim)>& size_of) const {
  std::vector<int64_t> values(symbols_.size());
  for (size_t i = 0; i < symbols_.size(); ++i) {
    const Symbol& s = symbols_[i];
    const std::optional<int64_t> v = size_of(s.input, s.dim);
    const std::string what = "kiln plan: size symbol " + std::to_string(s.id);
    if (!v) {
      return Status::RuntimeError(what + ": input " + std::to_string(s.input) +
                                  " has no dimension " + std::to_string(s.dim));
    }
    if (*v < s.min || (s.max != 0 && *v > s.max)) {
      return Status::RuntimeError(what + " is " + std::to_string(*v) + ", outside [" +
                                  std::to_string(s.min) + ", " +
                                  (s.max == 0 ? std::string("inf") : std::to_string(s.max)) +
                                  "] the plan was compiled for");
    }
    values[i] = *v;
  }
  return values;
}

std::vector<int64_t> PlanSizes::ExampleValues() const {
  std::vector<int64_t> values;
  for (const Symbol& s : symbols_) {
    int64_t v = std::max<int64_t>(s.min, 2);
    if (s.max != 0) v = std::min(v, s.max);
    values.push_back(v);
  }
  return values;
}

StatusOr<int64_t> PlanSizes::Evaluate(const SizeExpr& e, const std::vector<int64_t>& values) {
  int64_t sum = 0;
  for (const SizeExpr::Term& t : e.terms) {
    int64_t product = t.coefficient;
    for (int s : t.symbols) {
      if (__builtin_mul_overflow(product, values[static_cast<size_t>(s)], &product)) {
        return Status::RuntimeError("kiln plan: a size expression overflows int64_t");
      }
    }
    if (__builtin_add_overflow(sum, product, &sum)) {
      return Status::RuntimeError("kiln plan: a size expression overflows int64_t");
    }
  }
  return sum;
}

}  // namespace kiln::runtime
