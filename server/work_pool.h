// WorkPool: the threads that run SamplerService's blocking work (planning an upload, a rewind or
// a resize, creating or deleting a job, and the disk syncs of EndEpoch and ReportLosses).
//
// gRPC's callback API runs a call's reactions on a few threads of its own that must not block,
// and a call that waits (a StreamShard waiting for its epoch's plan, a loss stream between two
// batches) holds no thread at all. What does block runs here, on at most `max_threads` threads;
// work beyond them waits in a FIFO queue (memory, not a thread). None of that work waits for a
// plan or for a client, so the queue always drains: an EndEpoch is never starved by waiting
// ranks.
//
// Threads are started as work arrives and kept: freely up to kBurstThreads; beyond that, one
// more each kGrowAfter during which work waited and none finished (the threads are blocked,
// e.g. in fsync, not merely busy), so that a burst of short work (thousands of ranks' first
// chunks at an epoch boundary, on a machine with few cores) does not start a thread per item. A
// monitor thread watches for such stalls.
//
// Thread-safe.
#ifndef SAMPLERD_SERVER_WORK_POOL_H_
#define SAMPLERD_SERVER_WORK_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace samplerd {

class WorkPool {
 public:
  // Threads started without waiting, and how long work waits before another one is started.
  static constexpr int kBurstThreads = 8;
  static constexpr absl::Duration kGrowAfter = absl::Milliseconds(50);

  // `max_threads` >= 1.
  explicit WorkPool(int max_threads);
  // Runs the work still queued, then joins the threads.
  ~WorkPool();

  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Runs `work` on a pool thread, in FIFO order of scheduling.
  void Schedule(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

  struct Load {
    int64_t threads = 0;                                  // Started (they are kept).
    int64_t busy = 0;                                     // Running work now.
    int64_t queued = 0;                                   // Waiting for a thread.
    absl::Duration oldest_queued = absl::ZeroDuration();  // How long the first in line waited.
  };
  Load load() const ABSL_LOCKS_EXCLUDED(mu_);
  int max_threads() const { return max_threads_; }

 private:
  struct Queued {
    std::function<void()> work;
    absl::Time since;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a thread if work waits for one and none is idle: below kBurstThreads, or
  // (`stalled`) when no work finished for kGrowAfter.
  void MaybeGrow(bool stalled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Monitor() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  int64_t busy_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // Work run to its end, ever.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::thread monitor_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_WORK_POOL_H_
