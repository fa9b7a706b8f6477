// A fixed set of compile threads fed by a bounded queue. A full queue refuses work instead of
// growing, which is how back-pressure reaches clients (RESOURCE_EXHAUSTED).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::daemon {

class WorkerPool {
 public:
  WorkerPool(int threads, size_t queue_limit);
  // Drains (see Drain).
  ~WorkerPool();

  // Queues `task`; false when the queue already holds queue_limit tasks or the pool is draining.
  bool TrySubmit(std::function<void()> task);
  // Queues a task that was admitted once already and left the pool meanwhile (a compile that
  // waited for another daemon's), whatever the queue holds: the limit is for new work. False
  // only while the pool is draining.
  bool Resubmit(std::function<void()> task);
  // Refuses new tasks, runs every queued one, and joins the threads. Idempotent.
  void Drain();

  size_t queue_depth() const;
  size_t running() const;

 private:
  bool Queue(std::function<void()> task, bool limited);
  void Loop();

  const size_t queue_limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool draining_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln::daemon
