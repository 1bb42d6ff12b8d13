// A fixed pool of threads for the service's data work (aggregation, the outer step, encoding,
// hashing): ParallelFor splits a loop over independent tasks between the caller and the workers.
// Results never depend on the number of threads: every task writes its own outputs, and callers
// combine per-task results in task order.
#ifndef ATOLL_OUTER_BASE_WORKER_POOL_H_
#define ATOLL_OUTER_BASE_WORKER_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace atl::outer {

class WorkerPool {
 public:
  // `threads` >= 1 threads work on a loop: the caller and threads - 1 workers.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs fn(0) ... fn(n - 1), each once, and returns when all have run. Loops from several
  // threads take turns.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return int(workers_.size()) + 1; }

 private:
  void Work();
  // Runs tasks of the current loop until none is left.
  void Drain(std::unique_lock<std::mutex>& lock);

  std::mutex loop_mu_;  // one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0, next_ = 0, running_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// One thread that runs posted tasks in order, off the caller's path (work whose result is wanted
// later, such as buffers faulted in before a commit needs them). Tasks still queued when it is
// destroyed are dropped; the one running is finished first.
class BackgroundQueue {
 public:
  BackgroundQueue();
  ~BackgroundQueue();
  BackgroundQueue(const BackgroundQueue&) = delete;
  BackgroundQueue& operator=(const BackgroundQueue&) = delete;

  void Post(std::function<void()> task);

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

// Element ranges of a loop over n elements in spans of `span` (the last may be shorter).
inline size_t NumSpans(size_t n, size_t span) { return (n + span - 1) / span; }

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_WORKER_POOL_H_
