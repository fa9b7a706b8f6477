// WorkerPool: threads popping from one mutex-guarded deque.
#include "daemon/worker_pool.h"

namespace kiln::daemon {

WorkerPool::WorkerPool(int threads, size_t queue_limit) : queue_limit_(queue_limit) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() { Drain(); }

bool WorkerPool::TrySubmit(std::function<void()> task) { return Queue(std::move(task), true); }

bool WorkerPool::Resubmit(std::function<void()> task) { return Queue(std::move(task), false); }

bool WorkerPool::Queue(std::function<void()> task, bool limited) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || (limited && queue_.size() >= queue_limit_)) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

size_t WorkerPool::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t WorkerPool::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return draining_ || !queue_.empty(); });
      if (queue_.empty()) return;  // draining and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

}  // namespace kiln::daemon
