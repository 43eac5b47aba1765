// The split of --max_memory_bytes: defaults, explicit flags, a reserve that does not fit.
#include "server/memory_budget.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_memory.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryBudgetTest, DefaultsInATwoGibContainerLeaveTheJobsHalfTheBudget) {
  const uint64_t budget = 2 * kGiB / 5 * 4;  // DefaultMaxMemoryBytes under a 2 GiB cgroup.
  absl::StatusOr<MemoryBudget> b = MakeMemoryBudget(budget, 0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->total, budget);
  EXPECT_EQ(b->stream_buffers, budget / 4);     // 409.6 MiB
  EXPECT_EQ(b->transport_buffers, budget / 4);  // 409.6 MiB
  EXPECT_EQ(b->serving_reserve(), 2 * (budget / 4));
  EXPECT_EQ(b->jobs(), budget - 2 * (budget / 4));
  EXPECT_GE(b->jobs(), 819 * kMiB);
}

TEST(MemoryBudgetTest, DefaultsOnALargeMachineAreCapped) {
  absl::StatusOr<MemoryBudget> b = MakeMemoryBudget(100 * kGiB, 0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->stream_buffers, kDefaultMaxStreamBufferBytes);
  EXPECT_EQ(b->transport_buffers, kDefaultMaxTransportBufferBytes);
  EXPECT_EQ(b->jobs(), 98 * kGiB);
}

TEST(MemoryBudgetTest, TheDefaultBudgetIsThisMachines) {
  absl::StatusOr<MemoryBudget> b = MakeMemoryBudget(0, 1, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->total, DefaultMaxMemoryBytes());
  EXPECT_EQ(b->jobs(), DefaultMaxMemoryBytes() - 2);
}

TEST(MemoryBudgetTest, ExplicitFlagsAreKept) {
  absl::StatusOr<MemoryBudget> b = MakeMemoryBudget(10 * kGiB, 3 * kGiB, 5 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->stream_buffers, 3 * kGiB);
  EXPECT_EQ(b->transport_buffers, 5 * kMiB);
  EXPECT_EQ(b->jobs(), 7 * kGiB - 5 * kMiB);
}

TEST(MemoryBudgetTest, AReserveThatLeavesTheJobsNothingIsRefusedNamingTheFlags) {
  for (const auto& [streams, requests] : {std::pair<uint64_t, uint64_t>{kGiB, kGiB},
                                          {2 * kGiB, 1},
                                          {1, 2 * kGiB},
                                          {~uint64_t{0}, ~uint64_t{0}},
                                          {kGiB, 0}}) {
    // {kGiB, 0}: the default transport buffers (a quarter) on top of 1 GiB of stream buffers.
    const uint64_t total = requests == 0 ? kGiB + 128 * kMiB : 2 * kGiB;
    absl::StatusOr<MemoryBudget> b = MakeMemoryBudget(total, streams, requests);
    ASSERT_FALSE(b.ok()) << streams << " " << requests;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(b.status().message());
    EXPECT_THAT(message, HasSubstr("--max_stream_buffer_bytes = " + FormatBytes(streams)));
    EXPECT_THAT(message, HasSubstr("--max_transport_buffer_bytes = "));
    EXPECT_THAT(message, HasSubstr("--max_memory_bytes = " + FormatBytes(total)));
  }
}

}  // namespace
}  // namespace samplerd
