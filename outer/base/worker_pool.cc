#include "outer/base/worker_pool.h"

#include <algorithm>

namespace atl::outer {

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this] { Work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::Drain(std::unique_lock<std::mutex>& lock) {
  while (next_ < n_) {
    const auto* fn = fn_;  // read with its task: a worker may go on into the next loop
    const size_t i = next_++;
    ++running_;
    lock.unlock();
    (*fn)(i);
    lock.lock();
    --running_;
  }
  if (running_ == 0) done_cv_.notify_all();
}

void WorkerPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = 0;
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    Drain(lock);
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> loop(loop_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  ++generation_;
  work_cv_.notify_all();
  Drain(lock);
  done_cv_.wait(lock, [&] { return next_ >= n_ && running_ == 0; });
  fn_ = nullptr;
  n_ = 0;
}

BackgroundQueue::BackgroundQueue() : thread_([this] { Work(); }) {}

BackgroundQueue::~BackgroundQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    tasks_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundQueue::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void BackgroundQueue::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (stop_) return;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace atl::outer
