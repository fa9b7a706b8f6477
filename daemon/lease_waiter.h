// Compiles this daemon leaves to another daemon of the fleet, the holder of their key's lease
// (cache/compile_lease.h): one thread polls the shared tier for each such key's artifact, so that
// waiting holds no compile worker, and ends each wait exactly once.
//
// Contract: a wait polls 20 ms after Wait, then twice as long after each poll that finds the
// lease still held, up to 200 ms between polls, and never past `until`. It ends by one call of its
// `done` on the waiter's thread, saying how (WaitEnd) and, for kArtifact, with the artifact
// (verified, written through to the local tier). A wait still going on at Stop, or begun after
// it, ends with kStopped on the thread that called Stop or Wait. `done` must not call Stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/artifact_cache.h"
#include "cache/compile_lease.h"

namespace kiln::daemon {

enum class WaitEnd {
  kArtifact,     // The holder's artifact is in the shared tier: serve it.
  kLeaseGone,    // The lease went without an artifact (its holder failed or died): compile here.
  kTooLong,      // The lease is still held at `until`: compile here.
  kUnavailable,  // The shared tier stopped answering: compile here.
  kStopped,      // The daemon is stopping.
};

class LeaseWaiter {
 public:
  using Clock = std::chrono::steady_clock;
  using Done = std::function<void(WaitEnd, std::optional<cache::CacheHit>)>;

  // `cache` and `leases` must outlive the waiter.
  LeaseWaiter(cache::ArtifactCache* cache, cache::CompileLeases* leases);
  // Stops (see Stop).
  ~LeaseWaiter();

  LeaseWaiter(const LeaseWaiter&) = delete;
  LeaseWaiter& operator=(const LeaseWaiter&) = delete;

  // Waits for `key`'s artifact, at most until `until`.
  void Wait(std::string key, Clock::time_point until, Done done);
  // Ends every wait with kStopped, and the thread. Idempotent.
  void Stop();

 private:
  struct Waiting {
    std::string key;
    Clock::time_point until;
    Done done;
    Clock::time_point next_poll;
    std::chrono::milliseconds backoff;
  };

  // Looks once: how the wait ends (with the artifact in `hit`), or nullopt to look again.
  std::optional<WaitEnd> Poll(const Waiting& waiting, std::optional<cache::CacheHit>* hit);
  void Loop();

  cache::ArtifactCache* const cache_;
  cache::CompileLeases* const leases_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Waiting> waiting_;  // not counting the one being polled
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln::daemon
