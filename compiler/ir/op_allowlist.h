// The ATen operations kilnd knows by name: its passes and generators may treat them specially.
// Any other op must be admitted by its declared schema (op_admission.h) or is refused at
// validation, before any compiler sees it. To review a new op by name, add it to kDefaultOps in
// op_allowlist.cc.
#pragma once

#include <string>
#include <string_view>
#include <unordered_set>

namespace kiln::compiler {

class OpAllowlist {
 public:
  // The ops kiln supports today.
  static OpAllowlist Default();

  // Full schema names with overload, e.g. "aten::add.Tensor".
  bool Contains(std::string_view op) const { return ops_.count(std::string(op)) != 0; }
  void Add(std::string op) { ops_.insert(std::move(op)); }
  size_t size() const { return ops_.size(); }

 private:
  std::unordered_set<std::string> ops_;
};

}  // namespace kiln::compiler
