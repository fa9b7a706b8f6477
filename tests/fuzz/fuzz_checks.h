// What the libFuzzer targets share: the daemon's op allowlist, and invariant checks that crash
// (so that libFuzzer keeps the input as a reproducer).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "compiler/ir/op_allowlist.h"

namespace kiln::fuzz {

// The daemon's allowlist and limits: KilnServiceImpl validates with OpAllowlist::Default() and
// default ValidationLimits. (Its other check, max_request_bytes = 64 MiB, is far above any input
// libFuzzer makes.)
inline const kiln::compiler::OpAllowlist& Allowlist() {
  static const kiln::compiler::OpAllowlist allowlist = kiln::compiler::OpAllowlist::Default();
  return allowlist;
}

// A broken invariant is a crash: libFuzzer then saves the input as a reproducer.
inline void Check(bool holds, const char* what, std::string_view detail = {}) {
  if (holds) return;
  std::fprintf(stderr, "kiln fuzz invariant broken: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

}  // namespace kiln::fuzz
