// Generating each distinct kernel once: a network repeats its blocks (every transformer layer
// fuses into the same groups over the same sizes), so most of a graph's groups are the same code
// as an earlier group. The generators name a kernel's values by numbers local to its group
// (LocalNames), which makes such groups' texts equal up to the kernel's own name; a step whose
// kernel's text was seen before launches the earlier function, and the source holds each text
// once (NVRTC and g++ time grow with the source).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "compiler/ir/fused_program.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// The names a kernel gives the values of its group: a prefix and the value's number local to the
// group (its inputs, input_ids in order, then every output of its nodes in group order, from 0).
class LocalNames {
 public:
  LocalNames(const kiln::v1::Graph& graph, const FusedGroup& g);
  int Number(uint32_t id) const { return numbers_.at(id); }
  std::string operator()(const char* prefix, uint32_t id) const {
    return prefix + std::to_string(Number(id));
  }

 private:
  std::unordered_map<uint32_t, int> numbers_;
};

class DistinctKernels {
 public:
  // `text`: the code of the kernel exported as `symbol` (KernelSymbol), where every occurrence of
  // `symbol` not followed by a digit is a name of the kernel's own. Returns the symbol of the first
  // kernel added whose text is the same up to those names: `symbol` itself when the text is new,
  // and then the caller emits it.
  std::string Add(const std::string& symbol, const std::string& text);

 private:
  std::unordered_map<std::string, std::string> functions_;  // text without its names -> symbol
};

}  // namespace kiln::compiler
