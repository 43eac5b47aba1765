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
