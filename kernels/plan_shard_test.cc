#include "kernels/plan_shard.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

Plan PlanOf(uint64_t num_samples, const std::vector<uint64_t>& indices) {
  Plan plan;
  plan.num_samples = num_samples;
  for (uint64_t i : indices) {
    if (Plan::Narrow(num_samples)) {
      plan.indices32.push_back(static_cast<uint32_t>(i));
    } else {
      plan.indices64.push_back(i);
    }
  }
  return plan;
}

TEST(CopyShardTest, ReadsThePositionsOfTheShardArithmetic) {
  // 7 positions, 3 ranks, padded: rank 2 serves positions 2, 5 and 8 mod 7 = 1.
  for (uint64_t n : {uint64_t{100}, (uint64_t{1} << 32) + 5}) {  // Both index widths.
    const Plan plan = PlanOf(n, {10, 11, 12, 13, 14, 15, n - 1});
    const ShardSpec shard{3, PartitionMode::kInterleaved, UnevenMode::kPad};
    std::vector<uint64_t> out(3, 7);
    ASSERT_TRUE(CopyShard(plan, shard, 2, 0, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, (std::vector<uint64_t>{12, 15, 11}));
    std::vector<uint64_t> tail(1);
    ASSERT_TRUE(CopyShard(plan, {3, PartitionMode::kContiguous, UnevenMode::kUneven}, 0, 2,
                          absl::MakeSpan(tail))
                    .ok());
    EXPECT_EQ(tail[0], 12u);
  }
}

TEST(CopyShardTest, RefusesARangePastTheShardAndABadRank) {
  const Plan plan = PlanOf(100, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  std::vector<uint64_t> out(4, 7);
  absl::Status s = CopyShard(plan, {2, PartitionMode::kInterleaved, UnevenMode::kPad}, 1, 2,
                             absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard range [2, 6) passes the shard length 5"));
  EXPECT_EQ(out, std::vector<uint64_t>(4, 7));  // Untouched.
  s = CopyShard(plan, {2, PartitionMode::kInterleaved, UnevenMode::kPad}, 2, 0,
                absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank = 2"));
}

}  // namespace
}  // namespace samplerd
