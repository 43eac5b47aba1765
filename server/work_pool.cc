#include "server/work_pool.h"

#include <utility>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace samplerd {

WorkPool::WorkPool(int max_threads) : max_threads_(max_threads) {
  CHECK_GE(max_threads, 1);
  monitor_ = std::thread([this] { Monitor(); });
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  monitor_.join();
  // No thread is started once stopping_ is set: threads_ no longer changes.
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void WorkPool::Schedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(work), absl::Now()});
  MaybeGrow(/*stalled=*/false);
}

void WorkPool::MaybeGrow(bool stalled) {
  if (stopping_ || idle_ >= static_cast<int64_t>(queue_.size()) ||
      threads_.size() >= static_cast<size_t>(max_threads_)) {
    return;
  }
  if (threads_.size() >= static_cast<size_t>(kBurstThreads) && !stalled) return;
  threads_.emplace_back([this] { Run(); });
}

void WorkPool::Monitor() {
  absl::MutexLock lock(&mu_);
  auto stuck = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!queue_.empty() && idle_ == 0);
  };
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (true) {
    mu_.Await(absl::Condition(&stuck));
    if (stopping_) return;
    // Work waits and no thread is idle: another thread only if none finishes meanwhile.
    const int64_t finished = finished_;
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), kGrowAfter)) return;
    if (!queue_.empty()) MaybeGrow(finished_ == finished);
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
    ++finished_;
  }
}

}  // namespace samplerd
