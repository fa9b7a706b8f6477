// Waiting for a condition instead of sleeping for a fixed time.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace kiln::testing {

// Polls `condition` every few milliseconds; true once it holds, false after `timeout`.
inline bool WaitFor(const std::function<bool()>& condition,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

}  // namespace kiln::testing
