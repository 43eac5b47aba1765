#include "server/epoch_waiters.h"

#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

// An owner whose state is one epoch number: epochs up to it are settled.
class Owner {
 public:
  void Publish(uint64_t epoch) {
    absl::MutexLock lock(&mu_);
    published_ = epoch;
  }
  EpochWaiters& waiters() { return waiters_; }

 private:
  absl::Mutex mu_;
  uint64_t published_ ABSL_GUARDED_BY(mu_) = 0;
  EpochWaiters waiters_{
      &mu_, [this](uint64_t epoch) ABSL_NO_THREAD_SAFETY_ANALYSIS { return epoch <= published_; }};
};

TEST(EpochWaitersTest, ASettledEpochRunsTheCallbackAtOnce) {
  Owner owner;
  bool ran = false;
  EXPECT_EQ(owner.waiters().Add(0, absl::InfiniteFuture(), [&] { ran = true; }), 0u);
  EXPECT_TRUE(ran);
  EXPECT_EQ(owner.waiters().size(), 0u);
}

TEST(EpochWaitersTest, ThousandsOfWaitersRunOnceWhenTheirEpochIsPublished) {
  Owner owner;
  constexpr int kWaiters = 5000;
  std::atomic<int> ran_1{0}, ran_2{0};
  absl::Notification all;
  for (int i = 0; i < kWaiters; ++i) {
    EXPECT_NE(owner.waiters().Add(1, absl::InfiniteFuture(),
                                  [&] {
                                    if (++ran_1 == kWaiters) all.Notify();
                                  }),
              0u);
  }
  EXPECT_NE(owner.waiters().Add(2, absl::InfiniteFuture(), [&] { ++ran_2; }), 0u);
  EXPECT_EQ(owner.waiters().size(), static_cast<size_t>(kWaiters + 1));
  owner.Publish(1);  // No notify call: the change under the owner's lock wakes the watcher.
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(ran_1.load(), kWaiters);
  EXPECT_EQ(ran_2.load(), 0);  // Epoch 2 is not settled.
  EXPECT_EQ(owner.waiters().size(), 1u);
}

TEST(EpochWaitersTest, ADeadlineRunsTheCallbackWithoutThePublication) {
  Owner owner;
  absl::Notification late, early;
  owner.waiters().Add(1, absl::Now() + absl::Seconds(60), [&] { late.Notify(); });
  const absl::Time start = absl::Now();
  owner.waiters().Add(1, absl::Now() + absl::Milliseconds(50), [&] { early.Notify(); });
  ASSERT_TRUE(early.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_FALSE(late.HasBeenNotified());
}

TEST(EpochWaitersTest, ACancelledWaiterNeverRuns) {
  Owner owner;
  bool ran = false;
  const uint64_t id = owner.waiters().Add(1, absl::InfiniteFuture(), [&] { ran = true; });
  EXPECT_TRUE(owner.waiters().Cancel(id));
  EXPECT_FALSE(owner.waiters().Cancel(id));  // Already gone.
  absl::Notification other;
  owner.waiters().Add(1, absl::InfiniteFuture(), [&] { other.Notify(); });
  owner.Publish(1);
  ASSERT_TRUE(other.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(ran);
}

TEST(EpochWaitersTest, DestroyingTheOwnerDropsTheWaitersUnrun) {
  bool ran = false;
  {
    Owner owner;
    owner.waiters().Add(3, absl::InfiniteFuture(), [&] { ran = true; });
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace samplerd
