#include "server/stream_budget.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/retry_signal.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StreamBudgetTest, ReservationsThatFitAreGrantedAndGivenBackWhenDestroyed) {
  StreamBudget budget(100);
  {
    absl::StatusOr<StreamBudget::Reservation> a = budget.Reserve(60);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<StreamBudget::Reservation> b = budget.Reserve(40);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(budget.in_use(), 100u);
  }
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST(StreamBudgetTest, AReservationBeyondTheLimitIsResourceExhaustedNamingTheFlag) {
  StreamBudget budget(100);
  absl::StatusOr<StreamBudget::Reservation> held = budget.Reserve(70);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<StreamBudget::Reservation> more = budget.Reserve(31);
  ASSERT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(more.status().message());
  EXPECT_THAT(message, HasSubstr("needs 31 bytes"));
  EXPECT_THAT(message, HasSubstr("70 of the 100 bytes"));
  EXPECT_THAT(message, HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_THAT(message, HasSubstr("retry later"));  // It fits once the holder is gone.
  EXPECT_EQ(RetryAfter(more.status()), kStreamBudgetRetryAfter);  // Said for the clients.
  EXPECT_EQ(budget.in_use(), 70u);  // The failed reservation holds nothing.
  // Once the holder is gone the same reservation fits.
  *held = *budget.Reserve(1);  // Move-assigning releases the 70 bytes held before.
  EXPECT_EQ(budget.in_use(), 1u);
  EXPECT_TRUE(budget.Reserve(99).ok());
  // Larger than the whole budget: never fits, and retrying cannot help.
  const absl::Status never = budget.Reserve(101).status();
  EXPECT_EQ(never.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(never.message()), HasSubstr("more than the 100 bytes"));
  EXPECT_THAT(std::string(never.message()), HasSubstr("--max_stream_buffer_bytes"));
  EXPECT_THAT(std::string(never.message()), Not(HasSubstr("retry later")));
  EXPECT_FALSE(RetryAfter(never).has_value());
}

TEST(StreamBudgetTest, MovedReservationsReleaseOnce) {
  StreamBudget budget(10);
  {
    StreamBudget::Reservation a = *budget.Reserve(4);
    StreamBudget::Reservation b(std::move(a));
    EXPECT_EQ(b.bytes(), 4u);
    EXPECT_EQ(budget.in_use(), 4u);
  }
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST(StreamBudgetTest, ConcurrentReservationsNeverExceedTheLimit) {
  StreamBudget budget(1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&budget] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<StreamBudget::Reservation> r = budget.Reserve(300);
        if (r.ok()) {
          EXPECT_LE(budget.in_use(), 1000u);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(budget.in_use(), 0u);
}

}  // namespace
}  // namespace samplerd
