#include "server/work_pool.h"

#include <utility>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace samplerd {

WorkPool::WorkPool(int max_threads) : max_threads_(max_threads) { CHECK_GE(max_threads, 1); }

WorkPool::~WorkPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void WorkPool::Schedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(work), absl::Now()});
  // A thread is started only when none is idle to take the work.
  if (idle_ < static_cast<int64_t>(queue_.size()) &&
      threads_.size() < static_cast<size_t>(max_threads_)) {
    threads_.emplace_back([this] { Run(); });
  }
}

WorkPool::Load WorkPool::load() const {
  absl::MutexLock lock(&mu_);
  Load load;
  load.threads = static_cast<int64_t>(threads_.size());
  load.busy = busy_;
  load.queued = static_cast<int64_t>(queue_.size());
  if (!queue_.empty()) load.oldest_queued = absl::Now() - queue_.front().since;
  return load;
}

void WorkPool::Run() {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(&has_work));
    --idle_;
    if (queue_.empty()) return;  // Stopping, and everything queued has run.
    std::function<void()> work = std::move(queue_.front().work);
    queue_.pop_front();
    ++busy_;
    mu_.Unlock();
    work();
    work = nullptr;  // Whatever it owns goes before the lock is taken again.
    mu_.Lock();
    --busy_;
  }
}

}  // namespace samplerd
