// LeaseWaiter: one thread, each wait polled in turn when its time comes.
#include "daemon/lease_waiter.h"

#include <algorithm>

namespace kiln::daemon {
namespace {

constexpr std::chrono::milliseconds kFirstPoll{20};
constexpr std::chrono::milliseconds kLongestBetweenPolls{200};

}  // namespace

LeaseWaiter::LeaseWaiter(cache::ArtifactCache* cache, cache::CompileLeases* leases)
    : cache_(cache), leases_(leases) {
  thread_ = std::thread([this] { Loop(); });
}

LeaseWaiter::~LeaseWaiter() { Stop(); }

void LeaseWaiter::Wait(std::string key, Clock::time_point until, Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      const auto first = std::min(until, Clock::now() + kFirstPoll);
      waiting_.push_back({std::move(key), until, std::move(done), first, 2 * kFirstPoll});
      cv_.notify_all();
      return;
    }
  }
  done(WaitEnd::kStopped, std::nullopt);
}

void LeaseWaiter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Waiting> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended.swap(waiting_);
  }
  for (Waiting& w : ended) w.done(WaitEnd::kStopped, std::nullopt);
}

std::optional<WaitEnd> LeaseWaiter::Poll(const Waiting& waiting,
                                         std::optional<cache::CacheHit>* hit) {
  if (absl::StatusOr<cache::CacheHit> found = cache_->FetchShared(waiting.key); found.ok()) {
    *hit = *std::move(found);
    return WaitEnd::kArtifact;
  }
  // Looked at after the artifact: a holder publishes before it releases, so a lease found gone
  // here either failed, or published after the look above; one more look tells them apart, and
  // a holder that published is this wait's hit.
  absl::StatusOr<bool> held = leases_->Held(waiting.key);
  if (!held.ok()) return WaitEnd::kUnavailable;
  if (!*held) {
    if (absl::StatusOr<cache::CacheHit> found = cache_->FetchShared(waiting.key); found.ok()) {
      *hit = *std::move(found);
      return WaitEnd::kArtifact;
    }
    return WaitEnd::kLeaseGone;
  }
  if (Clock::now() >= waiting.until) return WaitEnd::kTooLong;
  return std::nullopt;
}

void LeaseWaiter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (waiting_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto due = std::min_element(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) {
      return a.next_poll < b.next_poll;
    });
    if (Clock::now() < due->next_poll) {
      cv_.wait_until(lock, due->next_poll);
      continue;
    }
    Waiting w = std::move(*due);
    waiting_.erase(due);
    lock.unlock();
    std::optional<cache::CacheHit> hit;
    std::optional<WaitEnd> end = Poll(w, &hit);
    if (end.has_value()) w.done(*end, std::move(hit));
    lock.lock();
    if (end.has_value()) continue;
    w.next_poll = std::min(w.until, Clock::now() + w.backoff);
    w.backoff = std::min(kLongestBetweenPolls, w.backoff * 2);
    waiting_.push_back(std::move(w));  // ended by Stop if it came meanwhile
  }
}

}  // namespace kiln::daemon
