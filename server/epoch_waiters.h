// EpochWaiters: callbacks waiting for an epoch to be settled, without a thread per waiter.
//
// A StreamShard call for an epoch not yet planned used to wait on the call's own thread (one
// gRPC thread per waiting rank: at an epoch boundary of thousands of ranks the server ran out
// of threads before the EndEpoch calls that open the next epoch could run). An EpochWaiters
// keeps such waiters as callbacks instead, and one watcher thread (started by the first waiter
// that has to wait) runs each once its epoch is settled or its deadline passed.
//
// "Settled" is the owner's predicate over the owner's state, guarded by the owner's mutex: the
// watcher waits on that mutex with an absl::Condition, so it is woken by every change the owner
// makes under its lock, and the owner's code that changes the state needs no call to notify it.
//
// Thread-safe. Lock order: the owner's mutex is the only lock; callbacks run without it.
#ifndef SAMPLERD_SERVER_EPOCH_WAITERS_H_
#define SAMPLERD_SERVER_EPOCH_WAITERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace samplerd {

class EpochWaiters {
 public:
  // `mu` guards the state `settled` reads; `settled(epoch)` is called with `mu` held and must
  // not take other locks. Both must outlive this object.
  EpochWaiters(absl::Mutex* mu, std::function<bool(uint64_t epoch)> settled);
  // Stops the watcher; callbacks still waiting are destroyed without being run. CHECK-fails if
  // called from a callback (see Add).
  ~EpochWaiters();

  EpochWaiters(const EpochWaiters&) = delete;
  EpochWaiters& operator=(const EpochWaiters&) = delete;

  // Runs `ready` once, without `mu` held, when `epoch` is settled or `deadline` has passed: at
  // once on the caller's thread if it is already (then returns 0), else later on the watcher
  // thread (then returns an id for Cancel, never 0). `ready` must not block (the watcher runs
  // the callbacks of all waiters one after the other), and must not destroy the owner: running
  // or destroying it must not drop the last reference to this object (hand the work and the
  // references it holds to another thread, e.g. a WorkPool, moving them out of the callback).
  uint64_t Add(uint64_t epoch, absl::Time deadline, std::function<void()> ready)
      ABSL_LOCKS_EXCLUDED(*mu_);
  // Withdraws waiter `id` (0: no-op). True if it was still waiting (its callback is destroyed
  // and will not run); false if its callback has run or is running.
  bool Cancel(uint64_t id) ABSL_LOCKS_EXCLUDED(*mu_);
  // Waiters not yet run.
  size_t size() const ABSL_LOCKS_EXCLUDED(*mu_);

 private:
  struct Waiter {
    uint64_t epoch;
    absl::Time deadline;
    std::function<void()> ready;
  };

  void Watch() ABSL_LOCKS_EXCLUDED(*mu_);
  // The watcher has something to do: stop, a new earlier deadline, or a waiter whose epoch
  // settled.
  bool Due() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // The earliest deadline of the waiters (a scan: the watcher's, once per wake).
  absl::Time NextDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);

  absl::Mutex* const mu_;
  const std::function<bool(uint64_t)> settled_;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(*mu_);  // By id.
  std::map<uint64_t, int64_t> epochs_ ABSL_GUARDED_BY(*mu_);  // Waiters per epoch.
  uint64_t next_id_ ABSL_GUARDED_BY(*mu_) = 1;
  // The deadline the watcher sleeps to, and whether a waiter was added with an earlier one.
  absl::Time sleeping_until_ ABSL_GUARDED_BY(*mu_) = absl::InfiniteFuture();
  bool earlier_deadline_ ABSL_GUARDED_BY(*mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(*mu_) = false;
  std::thread watcher_;  // Started under *mu_ by the first Add that waits; joined by ~.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_EPOCH_WAITERS_H_
