#include "server/epoch_deal.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;

// A plan of `m` positions whose entry at position q is 100 + q (N = `num_samples`).
Plan PlanOf(uint64_t m, uint64_t num_samples = 1000) {
  Plan plan;
  plan.epoch = 7;
  plan.num_samples = num_samples;
  for (uint64_t q = 0; q < m; ++q) {
    if (Plan::Narrow(num_samples)) {
      plan.indices32.push_back(static_cast<uint32_t>(100 + q));
    } else {
      plan.indices64.push_back(100 + q);
    }
  }
  return plan;
}

std::vector<uint64_t> Entries(const Plan& plan) {
  std::vector<uint64_t> out;
  for (uint64_t q = 0; q < plan.size(); ++q) out.push_back(plan[q]);
  return out;
}

ShardSpec Shards(uint32_t world, PartitionMode partition, UnevenMode uneven) {
  ShardSpec spec;
  spec.world_size = world;
  spec.partition = partition;
  spec.uneven = uneven;
  return spec;
}

TEST(RemainingPlanTest, NothingDoneKeepsEveryServedPosition) {
  const Plan plan = PlanOf(10);
  std::vector<PositionSet> sets(3);
  const std::vector<RankDone> ranks = {{&sets[0]}, {&sets[1]}, {&sets[2]}};
  for (UnevenMode uneven : {UnevenMode::kPad, UnevenMode::kUneven}) {
    const Plan left = RemainingPlan(plan, Shards(3, PartitionMode::kInterleaved, uneven), ranks);
    EXPECT_EQ(Entries(left), Entries(plan));
    EXPECT_EQ(left.epoch, 7u);
    EXPECT_EQ(left.num_samples, 1000u);
  }
  // DROP_LAST never served position 9 (3 shards of 3): it stays undealt.
  EXPECT_THAT(Entries(RemainingPlan(
                  plan, Shards(3, PartitionMode::kContiguous, UnevenMode::kDropLast), ranks)),
              ElementsAre(100, 101, 102, 103, 104, 105, 106, 107, 108));
}

TEST(RemainingPlanTest, ReportedPositionsAndEndedRanksAreDone) {
  // INTERLEAVED + PAD, M = 10, R = 3: rank 0 serves 0 3 6 9, rank 1 serves 1 4 7 0 (wrapped),
  // rank 2 serves 2 5 8 1 (wrapped).
  const Plan plan = PlanOf(10);
  std::vector<PositionSet> sets(3);
  sets[0].Insert(0, 4);  // Plan position 0.
  sets[0].Insert(1, 4);  // Plan position 3.
  sets[1].Insert(3, 4);  // The wrapped copy of plan position 0: already done by rank 0.
  const std::vector<RankDone> ranks = {{&sets[0]}, {&sets[1]}, {&sets[2], /*ended=*/true}};
  EXPECT_THAT(
      Entries(RemainingPlan(plan, Shards(3, PartitionMode::kInterleaved, UnevenMode::kPad), ranks)),
      ElementsAre(104, 106, 107, 109));
}

TEST(RemainingPlanTest, AWrappedCopyReportedMakesItsPositionDone) {
  // Rank 1's shard position 3 is plan position 0 (padding): reporting it there is enough.
  const Plan plan = PlanOf(10);
  std::vector<PositionSet> sets(3);
  sets[1].Insert(3, 4);
  const std::vector<RankDone> ranks = {{&sets[0]}, {&sets[1]}, {&sets[2]}};
  const std::vector<uint64_t> left =
      Entries(RemainingPlan(plan, Shards(3, PartitionMode::kInterleaved, UnevenMode::kPad), ranks));
  EXPECT_THAT(left, ElementsAre(101, 102, 103, 104, 105, 106, 107, 108, 109));
}

TEST(RemainingPlanTest, ContiguousDropLast) {
  // M = 10, R = 3, CONTIGUOUS + DROP_LAST: ranks serve 0-2, 3-5, 6-8; 9 is never served.
  const Plan plan = PlanOf(10);
  std::vector<PositionSet> sets(3);
  sets[1].Insert(1, 3);  // Plan position 4.
  sets[2].Insert(0, 3);  // Plan position 6.
  sets[2].Insert(2, 3);  // Plan position 8.
  const std::vector<RankDone> ranks = {{&sets[0]}, {&sets[1]}, {&sets[2]}};
  EXPECT_THAT(Entries(RemainingPlan(
                  plan, Shards(3, PartitionMode::kContiguous, UnevenMode::kDropLast), ranks)),
              ElementsAre(100, 101, 102, 103, 105, 107));
}

TEST(RemainingPlanTest, EverythingDoneLeavesAnEmptyPlan) {
  const Plan plan = PlanOf(5);
  std::vector<PositionSet> sets(2);
  const std::vector<RankDone> ranks = {{&sets[0], true}, {&sets[1], true}};
  const Plan left =
      RemainingPlan(plan, Shards(2, PartitionMode::kInterleaved, UnevenMode::kUneven), ranks);
  EXPECT_EQ(left.size(), 0u);
  // The next deal's shards are then empty, for any world size.
  EXPECT_EQ(*ShardLength(left.size(), Shards(3, PartitionMode::kInterleaved, UnevenMode::kPad), 2),
            0u);
}

TEST(RemainingPlanTest, WideIndices) {
  const uint64_t n = (uint64_t{1} << 32) + 5;
  const Plan plan = PlanOf(4, n);
  std::vector<PositionSet> sets(1);
  sets[0].Insert(2, 4);
  const std::vector<RankDone> ranks = {{&sets[0]}};
  const Plan left =
      RemainingPlan(plan, Shards(1, PartitionMode::kInterleaved, UnevenMode::kPad), ranks);
  EXPECT_TRUE(left.indices32.empty());
  EXPECT_THAT(Entries(left), ElementsAre(100, 101, 103));
}

}  // namespace
}  // namespace samplerd
