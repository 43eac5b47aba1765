#include "server/saturation_monitor.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

metrics::ProcessResources Fds(int64_t open, int64_t max) {
  metrics::ProcessResources p;
  p.open_fds = open;
  p.max_fds = max;
  return p;
}

TEST(SaturationTest, FewDescriptorsLeftIsSaturated) {
  const SaturationMonitor::Limits limits;
  EXPECT_EQ(SaturationMonitor::Saturation(Fds(100, 20000), {}, 16, limits), "");
  EXPECT_THAT(SaturationMonitor::Saturation(Fds(19990, 20000), {}, 16, limits),
              HasSubstr("file descriptors: 19990 of 20000 open"));
  EXPECT_EQ(SaturationMonitor::Saturation(Fds(-1, -1), {}, 16, limits), "");  // Unreadable.
}

TEST(SaturationTest, WorkWaitingTooLongForAThreadIsSaturated) {
  const SaturationMonitor::Limits limits;
  WorkPool::Load load;
  load.busy = 16;
  load.queued = 3;
  load.oldest_queued = absl::Seconds(1);
  EXPECT_EQ(SaturationMonitor::Saturation(Fds(10, 1000), load, 16, limits), "");
  load.oldest_queued = absl::Seconds(6);
  EXPECT_THAT(SaturationMonitor::Saturation(Fds(10, 1000), load, 16, limits),
              HasSubstr("handler threads: 16 of 16 busy and work has waited 6s"));
}

TEST(SaturationMonitorTest, HealthFollowsTheLoad) {
  metrics::Registry registry;
  std::atomic<bool> stuck{false};
  absl::Mutex mu;
  std::vector<bool> statuses;
  SaturationMonitor::Limits limits;
  limits.period = absl::Milliseconds(10);
  limits.max_queue_wait = absl::Seconds(1);
  {
    SaturationMonitor monitor(
        [&] {
          WorkPool::Load load;
          if (stuck) {
            load.queued = 1;
            load.oldest_queued = absl::Seconds(2);
          }
          return load;
        },
        16,
        [&](bool serving) {
          absl::MutexLock lock(&mu);
          statuses.push_back(serving);
        },
        &registry, limits);
    auto seen = [&](size_t n) {
      absl::MutexLock lock(&mu);
      auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return statuses.size() >= n; };
      return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    };
    stuck = true;
    ASSERT_TRUE(seen(1));
    EXPECT_THAT(registry.Render(), HasSubstr("samplerd_saturated 1"));
    stuck = false;
    ASSERT_TRUE(seen(2));
    EXPECT_THAT(registry.Render(), HasSubstr("samplerd_saturated 0"));
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(statuses, (std::vector<bool>{false, true}));  // Only transitions are reported.
}

}  // namespace
}  // namespace samplerd
