// The host C++ compiler as kilnd runs it: generated source in a private temporary directory,
// g++ started with posix_spawn (no shell), a time limit, the shared object's bytes back.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::compiler {

class Toolchain {
 public:
  Toolchain(std::string cxx, std::chrono::seconds timeout);

  // Builds `source` into a shared object for `isa` (one of KnownIsa()). On a compiler failure
  // the status is kInternal with the first lines of its diagnostics (the caller makes it a
  // CODE_TOOLCHAIN error); kDeadlineExceeded when it ran past the time limit.
  absl::StatusOr<std::string> BuildSharedObject(const std::string& source,
                                                const std::string& isa) const;

  // "<cxx -dumpfullversion>|<cxx --version first line>|<flags>": part of every cache key.
  const std::string& Version() const { return version_; }

  // The ISAs a Target may name; anything else never reaches a command line.
  static bool KnownIsa(const std::string& isa);
  // The ISA an empty Target.cpu_isa means on this host ("x86-64" or "armv8-a").
  static std::string BaselineIsa();
  // True when `isa` belongs to this host's architecture (kilnd does not cross-compile).
  static bool HostBuildsFor(const std::string& isa);
  static std::vector<std::string> Flags(const std::string& isa);
  static std::vector<std::string> Libraries(const std::string& isa);

  // Removes the build directories ($TMPDIR/kilnd-cc-*, this user's) of processes that are gone:
  // a kilnd killed mid-compile cannot remove its own. Each directory names its process in a
  // kilnd.pid file; one without it, or whose process runs, is kept. Returns how many it removed.
  // The constructor calls it, so each kilnd start clears what earlier ones left.
  static int RemoveOrphanedBuildDirs();

 private:
  std::string cxx_;
  std::chrono::seconds timeout_;
  std::string version_;
};

}  // namespace kiln::compiler
