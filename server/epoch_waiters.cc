#include "server/epoch_waiters.h"

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace samplerd {

EpochWaiters::EpochWaiters(absl::Mutex* mu, std::function<bool(uint64_t)> settled)
    : mu_(mu), settled_(std::move(settled)) {}

EpochWaiters::~EpochWaiters() {
  {
    absl::MutexLock lock(mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) {
    CHECK(watcher_.get_id() != std::this_thread::get_id())
        << "an EpochWaiters callback destroyed its owner";
    watcher_.join();
  }
  absl::MutexLock lock(mu_);
  waiters_.clear();
  epochs_.clear();
}

uint64_t EpochWaiters::Add(uint64_t epoch, absl::Time deadline, std::function<void()> ready) {
  {
    absl::MutexLock lock(mu_);
    if (!settled_(epoch) && absl::Now() < deadline && !stopping_) {
      if (!watcher_.joinable()) watcher_ = std::thread([this] { Watch(); });
      if (deadline < sleeping_until_) earlier_deadline_ = true;
      const uint64_t id = next_id_++;
      waiters_.emplace(id, Waiter{epoch, deadline, std::move(ready)});
      ++epochs_[epoch];
      return id;
    }
  }
  ready();
  return 0;
}

bool EpochWaiters::Cancel(uint64_t id) {
  std::function<void()> dropped;  // Destroyed off the lock: it may own the caller's state.
  absl::MutexLock lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  if (--epochs_[it->second.epoch] == 0) epochs_.erase(it->second.epoch);
  dropped = std::move(it->second.ready);
  waiters_.erase(it);
  return true;
}

size_t EpochWaiters::size() const {
  absl::MutexLock lock(mu_);
  return waiters_.size();
}

bool EpochWaiters::Due() const {
  if (stopping_ || earlier_deadline_) return true;
  for (const auto& [epoch, count] : epochs_) {
    if (settled_(epoch)) return true;
  }
  return false;
}

absl::Time EpochWaiters::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, waiter] : waiters_) next = std::min(next, waiter.deadline);
  return next;
}

void EpochWaiters::Watch() {
  absl::MutexLock lock(mu_);
  while (true) {
    sleeping_until_ = NextDeadline();
    mu_->AwaitWithDeadline(absl::Condition(this, &EpochWaiters::Due), sleeping_until_);
    if (stopping_) return;
    earlier_deadline_ = false;
    const absl::Time now = absl::Now();
    std::vector<std::function<void()>> ready;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      const Waiter& waiter = it->second;
      if (settled_(waiter.epoch) || now >= waiter.deadline) {
        if (--epochs_[waiter.epoch] == 0) epochs_.erase(waiter.epoch);
        ready.push_back(std::move(it->second.ready));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (ready.empty()) continue;
    mu_->Unlock();
    for (std::function<void()>& run : ready) run();
    ready.clear();  // Destroyed off the lock too.
    mu_->Lock();
  }
}

}  // namespace samplerd
