#include "compiler/codegen/distinct_kernels.h"

namespace kiln::compiler {

LocalNames::LocalNames(const kiln::v1::Graph& graph, const FusedGroup& g) {
  for (uint32_t id : g.input_ids) numbers_.emplace(id, static_cast<int>(numbers_.size()));
  for (int ni : g.nodes) {
    for (const auto& out : graph.nodes(ni).outputs()) {
      numbers_.emplace(out.id(), static_cast<int>(numbers_.size()));
    }
  }
}

std::string DistinctKernels::Add(const std::string& symbol, const std::string& text) {
  std::string unnamed;
  unnamed.reserve(text.size());
  size_t from = 0;
  for (size_t at = text.find(symbol); at != std::string::npos; at = text.find(symbol, at + 1)) {
    const size_t end = at + symbol.size();
    if (end < text.size() && text[end] >= '0' && text[end] <= '9') continue;  // a longer symbol
    unnamed.append(text, from, at - from);
    unnamed += '$';  // never in generated code
    from = end;
  }
  unnamed.append(text, from, std::string::npos);
  return functions_.emplace(std::move(unnamed), symbol).first->second;
}

}  // namespace kiln::compiler
