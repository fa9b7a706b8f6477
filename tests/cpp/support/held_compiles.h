// A daemon of one worker and a queue of one, made full: one compile held on the worker by the
// TestCompiler's gate and one queued behind it, so that a third is refused (RESOURCE_EXHAUSTED).
#pragma once

#include <gtest/gtest.h>

#include <future>

#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/test_daemon.h"
#include "tests/cpp/support/wait_for.h"

namespace kiln::testing {

// The configuration HeldCompiles needs: one worker, a queue of one.
inline void OneWorkerQueueOfOne(daemon::DaemonConfig& c) {
  c.workers = 1;
  c.queue_limit = 1;
}

class HeldCompiles {
 public:
  // Holds `kilnd`'s compiler and returns once MakeRequest(0) runs and MakeRequest(1) is queued,
  // both callers waiting for their compile. MakeRequest(2) and later variants find the queue full.
  explicit HeldCompiles(TestDaemon& kilnd) : kilnd_(kilnd) {
    kilnd_.compiler().Hold();
    running_ = std::async(std::launch::async,
                          [this] { return kilnd_.Compile(MakeRequest(0), &responses_[0]); });
    EXPECT_TRUE(WaitFor([&] { return kilnd_.compiler().compiles() == 1; }));
    queued_ = std::async(std::launch::async,
                         [this] { return kilnd_.Compile(MakeRequest(1), &responses_[1]); });
    EXPECT_TRUE(WaitFor([&] {
      kiln::v1::StatsResponse stats = kilnd_.Stats();
      return stats.queue_depth() == 1 && stats.waiting() == 2;
    }));
  }
  ~HeldCompiles() { Release(); }

  // Opens the gate; true when both compiles then answered OK. Idempotent.
  bool Release() {
    kilnd_.compiler().Release();
    if (!running_.valid()) return released_ok_;
    released_ok_ = running_.get().ok() && queued_.get().ok();
    return released_ok_;
  }

 private:
  TestDaemon& kilnd_;
  kiln::v1::CompileResponse responses_[2];
  std::future<grpc::Status> running_;
  std::future<grpc::Status> queued_;
  bool released_ok_ = false;
};

}  // namespace kiln::testing
