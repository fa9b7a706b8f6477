// NVRTC for the tests that build CUDA kernels (no GPU needed). Found as kilnd's users find it:
// $KILN_NVRTC, else the CUDA wheel of the project's virtual environment (scripts/setup.sh puts
// torch's nvidia-*-cu13 dependencies there), else the loader's search path. A machine without it
// fails those tests, unless KILN_NVRTC_REQUIRED=0 turns the failure into a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "compiler/toolchain/nvrtc.h"

namespace kiln::testing {

// The libnvrtc a test should load first: $KILN_NVRTC, or the newest CUDA wheel's under
// `source_dir`/.venv (empty when there is none).
inline std::string NvrtcPathForTests(const std::string& source_dir = KILN_SOURCE_DIR) {
  if (const char* env = std::getenv("KILN_NVRTC"); env != nullptr && *env != '\0') return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string found;
  const fs::path lib = fs::path(source_dir) / ".venv" / "lib";
  for (const auto& python : fs::directory_iterator(lib, ec)) {
    const fs::path nvidia = python.path() / "site-packages" / "nvidia";
    for (const char* cuda : {"cu12", "cuda_nvrtc", "cu13"}) {
      for (const char* so : {"libnvrtc.so.12", "libnvrtc.so.13"}) {
        const fs::path p = nvidia / cuda / "lib" / so;
        if (fs::exists(p, ec)) found = p.string();
      }
    }
  }
  return found;
}

inline bool NvrtcRequired() {
  const char* env = std::getenv("KILN_NVRTC_REQUIRED");
  return env == nullptr || std::string(env) != "0";
}

// NVRTC loaded for a test, or nullptr with the reason in `why`.
inline std::unique_ptr<kiln::compiler::Nvrtc> LoadNvrtcForTests(std::string* why) {
  auto nvrtc = kiln::compiler::Nvrtc::Load(kiln::compiler::Nvrtc::Candidates(NvrtcPathForTests()));
  if (nvrtc.ok()) return std::move(*nvrtc);
  *why = std::string(nvrtc.status().message());
  return nullptr;
}

}  // namespace kiln::testing
