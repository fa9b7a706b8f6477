// NVRTC, the CUDA runtime compiler, as kilnd runs it: libnvrtc loaded with dlopen at run time
// (never linked, so a kilnd without it still serves CPU targets), CUDA C++ in, a cubin for one
// real architecture and PTX for its virtual one out. Needs no GPU and no nvcc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::compiler {

// What one NVRTC build of a source yields.
struct CudaBinary {
  std::string cubin;  // ELF for exactly the requested sm_XY
  std::string ptx;    // the same kernels for compute_XY, for GPUs newer than sm_XY
};

class Nvrtc {
 public:
  // The libraries Load tries, in order: `explicit_path` ($KILN_NVRTC, a path to libnvrtc.so.*)
  // when not empty, then libnvrtc.so.13, libnvrtc.so.12 and libnvrtc.so by the loader's search
  // path.
  static std::vector<std::string> Candidates(const std::string& explicit_path);

  // The first candidate that loads and has every function kilnd calls. kUnimplemented ("no
  // NVRTC: ...", with each candidate's loader error) when none does. NVRTC's builtins library
  // (libnvrtc-builtins.so.<version>), which NVRTC itself opens by name when it compiles, is
  // loaded first from the directory libnvrtc came from, so a libnvrtc outside the loader's path
  // (a pip wheel's) works without LD_LIBRARY_PATH.
  static absl::StatusOr<std::unique_ptr<Nvrtc>> Load(const std::vector<std::string>& candidates);

  // Leaves libnvrtc loaded (see nvrtc.cc).
  ~Nvrtc();
  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;

  // Builds `source` (self-contained: NVRTC finds no headers) for `arch` ("sm_90", "sm_90a"; the
  // caller validated it), in one NVRTC compile: a cubin for arch and PTX for the matching
  // compute_XY, its functions optimized on several threads where NVRTC can. On a compile
  // error the status is kInternal with the start of NVRTC's log (the caller makes it a
  // CODE_TOOLCHAIN error). Thread-safe: each call compiles its own programs.
  absl::StatusOr<CudaBinary> Build(const std::string& source, const std::string& arch) const;

  // "nvrtc-<major>.<minor>": part of every cache key of CUDA compiles.
  const std::string& Version() const { return version_; }
  // Where libnvrtc was loaded from (the candidate's name as given).
  const std::string& Library() const { return library_; }

  // The options every build passes besides the architecture.
  static std::vector<std::string> Flags();

  struct Api;  // the entry points kilnd calls (nvrtc.cc)

 private:
  Nvrtc(std::unique_ptr<Api> api, std::string library);

  // How many threads one build optimizes its functions on (1: NVRTC older than 12.4).
  int SplitThreads() const;
  // A compiled program's cubin (`cubin` true) or PTX.
  absl::StatusOr<std::string> Output(void* program, bool cubin) const;

  // Threads for --split-compile: a fixed count, so that a build's bytes do not depend on the
  // machine (NVRTC's output differs with the thread count).
  static constexpr int kSplitThreads = 8;

  std::unique_ptr<Api> api_;
  std::string library_;
  std::string version_;
};

}  // namespace kiln::compiler
