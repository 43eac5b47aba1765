#include "server/work_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(WorkPoolTest, WorkBeyondTheThreadsWaitsInLineAndRuns) {
  std::atomic<int> done{0};
  absl::Notification release;
  {
    WorkPool pool(2);
    for (int i = 0; i < 2; ++i) {
      pool.Schedule([&] {
        release.WaitForNotification();
        ++done;
      });
    }
    for (int i = 0; i < 10; ++i) pool.Schedule([&] { ++done; });
    const WorkPool::Load load = pool.load();
    EXPECT_LE(load.threads, 2);  // Never more than max_threads.
    EXPECT_GE(load.queued, 8);
    release.Notify();
  }  // The destructor runs what is queued.
  EXPECT_EQ(done.load(), 12);
}

TEST(WorkPoolTest, ABurstOfShortWorkStartsFewThreads) {
  WorkPool pool(1024);
  std::atomic<int> done{0};
  absl::Notification all;
  for (int i = 0; i < 10000; ++i) {
    pool.Schedule([&] {
      if (++done == 10000) all.Notify();
    });
  }
  all.WaitForNotification();
  // Threads beyond the burst start only when no work finished for kGrowAfter: short work keeps
  // finishing (a machine stalled for 50 ms may still let a few start).
  EXPECT_LT(pool.load().threads, 64);
}

TEST(WorkPoolTest, WorkBehindBlockedThreadsGetsAThread) {
  // Declared before the pool, so that they outlive its threads: the pool's destructor joins them,
  // and a thread woken by release.Notify() may still be inside WaitForNotification() when the
  // test body ends (--config=tsan_deps reported the Notification destroyed under it).
  absl::Notification release, ran;
  WorkPool pool(WorkPool::kBurstThreads + 1);
  for (int i = 0; i < WorkPool::kBurstThreads; ++i) {
    pool.Schedule([&] { release.WaitForNotification(); });
  }
  pool.Schedule([&] { ran.Notify(); });  // Every thread is blocked: the monitor starts one more.
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(pool.load().threads, WorkPool::kBurstThreads + 1);
  release.Notify();
}

TEST(WorkPoolTest, ThreadsStartOnlyAsWorkArrives) {
  WorkPool pool(64);
  EXPECT_EQ(pool.load().threads, 0);
  absl::Notification ran;
  pool.Schedule([&] { ran.Notify(); });
  ran.WaitForNotification();
  EXPECT_EQ(pool.load().threads, 1);
}

}  // namespace
}  // namespace samplerd
