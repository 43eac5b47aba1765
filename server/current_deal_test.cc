#include "server/current_deal.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/deal_changes.h"
#include "server/epoch_history.h"
#include "server/job_config.h"
#include "server/testing/loss_batches.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::BatchAt;

float One(uint64_t) { return 1.0f; }

// The recorded changes of `deal` (DealChanges, the only way to make them), with an in-memory
// history (which records nothing; deal_changes_test.cc has a history whose records fail).
struct Recorded {
  explicit Recorded(CurrentDeal* deal)
      : history(MakeInMemoryHistory("j", *MakeJobConfig(Spec(), JobLimits()))),
        changes(history.get(), deal) {}
  static v1::JobSpec Spec() {
    v1::JobSpec spec;
    spec.set_num_samples(1000);
    spec.set_world_size(1);
    return spec;
  }
  CurrentDeal::NewLosses Reported(const LossBatchView& batch) {
    absl::StatusOr<CurrentDeal::NewLosses> pairs =
        changes.Reported(batch, history->PrepareLosses(batch));
    EXPECT_TRUE(pairs.ok()) << pairs.status();
    return *std::move(pairs);
  }
  std::unique_ptr<EpochHistory> history;
  DealChanges changes;
};

// A plan of `m` positions holding indices 100, 101, ... (any distinct values do).
Plan PlanOf(uint64_t m) {
  Plan plan;
  plan.num_samples = 1000;
  plan.indices32.resize(m);
  std::iota(plan.indices32.begin(), plan.indices32.end(), uint32_t{100});
  return plan;
}

std::vector<uint64_t> Indices(const Plan& plan) {
  std::vector<uint64_t> indices;
  for (uint64_t p = 0; p < plan.size(); ++p) indices.push_back(plan[p]);
  return indices;
}

ShardSpec Interleaved(uint32_t world_size) {
  ShardSpec shard;
  shard.world_size = world_size;
  return shard;
}

// Rank `rank`'s shard of `plan` as streamed (position k holds the k-th index).
std::vector<uint64_t> ShardOf(const CurrentDeal& deal, const Plan& plan, uint32_t rank) {
  std::vector<uint64_t> shard;
  const uint64_t length = *deal.ShardLength(rank);
  for (uint64_t k = 0; k < length; ++k) {
    shard.push_back(plan[ShardToPlanPosition(deal.length(), deal.shard(), rank, k)]);
  }
  return shard;
}

TEST(CurrentDealTest, ChecksNameTheJobTheEpochAndTheDeal) {
  CurrentDeal deal("j", Interleaved(4), 100);
  Recorded recorded(&deal);
  EXPECT_TRUE(deal.CheckDeal(3, 0).ok());
  EXPECT_TRUE(deal.CheckWorldSize(3, 4).ok());
  ASSERT_TRUE(recorded.changes.Redealt(3, 2, 60, /*replaced_started=*/false).ok());
  const absl::Status replaced = deal.CheckDeal(3, 0);
  EXPECT_EQ(replaced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(replaced.message()),
              HasSubstr("deal = 0 of epoch 3 of job 'j' was replaced by deal 1 (2 ranks)"));
  EXPECT_THAT(std::string(deal.CheckDeal(3, 2).message()),
              HasSubstr("deal = 2 of epoch 3 of job 'j' does not exist; the current deal is 1"));
  EXPECT_THAT(std::string(deal.CheckWorldSize(3, 4).message()),
              HasSubstr("world_size = 4 does not match the 2 ranks that epoch 3 of job 'j'"));
  EXPECT_EQ(*deal.ShardLength(1), 30u);
  EXPECT_EQ(deal.ShardLength(2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CurrentDealTest, ALossMustBeForTheIndexServedAtItsPosition) {
  CurrentDeal deal("j", Interleaved(2), 10);
  const Plan plan = PlanOf(10);
  const std::vector<uint64_t> shard = ShardOf(deal, plan, 1);
  EXPECT_EQ(*deal.CheckLosses(BatchAt(0, 1, 0, shard, {0, 3}, One).view(), plan), 2u);
  testutil::OwnedLossBatch wrong = BatchAt(0, 1, 0, shard, {0, 3}, One);
  wrong.indices[1] = shard[2];
  const absl::StatusOr<size_t> refused = deal.CheckLosses(wrong.view(), plan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("positions[1] = 3 of epoch 0 (that position holds index " +
                        std::to_string(shard[3])));
  // Outside the rank's shard of 5 positions.
  EXPECT_EQ(deal.CheckLosses(BatchAt(0, 1, 0, Indices(PlanOf(10)), {5}, One).view(), plan)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CurrentDealTest, APositionReportedBeforeIsADuplicateWhateverBatchSendsIt) {
  CurrentDeal deal("j", Interleaved(1), 8);
  Recorded recorded(&deal);
  const Plan plan = PlanOf(8);
  const std::vector<uint64_t> shard = ShardOf(deal, plan, 0);
  const testutil::OwnedLossBatch first = BatchAt(0, 0, 0, shard, {0, 1}, One);
  ASSERT_EQ(*deal.CheckLosses(first.view(), plan), 2u);
  const CurrentDeal::NewLosses all = recorded.Reported(first.view());
  EXPECT_THAT(all.indices(), ElementsAre(shard[0], shard[1]));
  // Position 1 again and twice in the batch, between new positions 2 and 3.
  testutil::OwnedLossBatch mixed = BatchAt(0, 0, 1, shard, {1, 2, 1, 3}, One);
  mixed.losses = {10, 20, 30, 40};
  ASSERT_EQ(*deal.CheckLosses(mixed.view(), plan), 2u);
  const CurrentDeal::NewLosses some = recorded.Reported(mixed.view());
  EXPECT_THAT(some.indices(), ElementsAre(shard[2], shard[3]));
  EXPECT_THAT(some.losses(), ElementsAre(20, 40));
  // A retry: nothing new.
  EXPECT_EQ(*deal.CheckLosses(mixed.view(), plan), 0u);
  EXPECT_TRUE(deal.Started());
  EXPECT_TRUE(deal.AnyDone());
}

TEST(CurrentDealTest, RanksNotEndedNamesTheFirstSixteenAndCountsTheRest) {
  CurrentDeal deal("j", Interleaved(20000), 20000);
  Recorded recorded(&deal);
  for (uint32_t r = 0; r < 20000; r += 2) ASSERT_TRUE(recorded.changes.Ended(0, r).ok());
  EXPECT_EQ(deal.RanksNotEnded(),
            "ranks 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31 and 9984 more of "
            "world_size 20000 have not ended it (EndEpoch)");
}

TEST(CurrentDealTest, RanksEndingAndTheNextEpochsDeal) {
  CurrentDeal deal("j", Interleaved(3), 30);
  Recorded recorded(&deal);
  EXPECT_FALSE(deal.Started());
  EXPECT_TRUE(recorded.changes.Ended(0, 1).ok());
  EXPECT_TRUE(recorded.changes.Ended(0, 1).ok());  // Idempotent.
  EXPECT_EQ(deal.ranks_ended(), 1u);
  EXPECT_FALSE(deal.AllEnded());
  EXPECT_EQ(deal.RanksNotEnded(), "ranks 0, 2 of world_size 3 have not ended it (EndEpoch)");
  ASSERT_TRUE(recorded.changes.Ended(0, 0).ok());
  EXPECT_EQ(deal.RanksNotEnded(), "ranks 2 of world_size 3 have not ended it (EndEpoch)");
  ASSERT_TRUE(recorded.changes.Ended(0, 2).ok());
  EXPECT_TRUE(deal.AllEnded());
  deal.DealNextEpoch(30);
  EXPECT_EQ(deal.ranks_ended(), 3u);  // Visible until the next epoch is served.
  deal.ServeEpoch(30);
  EXPECT_EQ(deal.ranks_ended(), 0u);
  EXPECT_FALSE(deal.Started());
  EXPECT_EQ(deal.start_world_size(), 3u);
}

TEST(CurrentDealTest, AResizeKeepsTheStartWorldSizeAndThatTheEpochStarted) {
  CurrentDeal deal("j", Interleaved(4), 40);
  Recorded recorded(&deal);
  EXPECT_TRUE(deal.Advances(0, 2, 5));
  ASSERT_TRUE(recorded.changes.Streamed(0, 2, 5).ok());
  EXPECT_FALSE(deal.Advances(0, 2, 5));
  EXPECT_FALSE(deal.Advances(1, 2, 9));  // Not this deal.
  EXPECT_TRUE(deal.Started());
  EXPECT_FALSE(deal.AnyDone());  // Streamed only.
  ASSERT_TRUE(recorded.changes.Redealt(0, 2, 40, /*replaced_started=*/true).ok());
  EXPECT_EQ(deal.number(), 1u);
  EXPECT_EQ(deal.start_world_size(), 4u);
  EXPECT_TRUE(deal.Started());  // The replaced deal had started.
  deal.ServeEpoch(40);          // A re-upload after the resize keeps the start world size.
  EXPECT_EQ(deal.start_world_size(), 4u);
  deal.DealAgain(4);  // A rewind: deal 0 to the ranks the epoch started with.
  EXPECT_EQ(deal.number(), 0u);
  EXPECT_EQ(deal.world_size(), 4u);
}

TEST(CurrentDealTest, TheProgressTakenOutComputesTheRemainingPlanOrGoesBack) {
  CurrentDeal deal("j", Interleaved(2), 6);
  Recorded recorded(&deal);
  const Plan plan = PlanOf(6);
  const std::vector<uint64_t> shard = ShardOf(deal, plan, 0);
  const testutil::OwnedLossBatch done = BatchAt(0, 0, 0, shard, {0}, One);
  ASSERT_EQ(*deal.CheckLosses(done.view(), plan), 1u);
  recorded.Reported(done.view());
  ASSERT_TRUE(recorded.changes.Ended(0, 1).ok());  // Rank 1 consumed its whole shard.
  CurrentDeal::Progress progress = deal.TakeProgress();
  EXPECT_FALSE(deal.AnyDone());  // The deal's ranks start over meanwhile.
  // Rank 0's positions 1 and 2 are left: plan positions 2 and 4.
  EXPECT_THAT(Indices(progress.Remaining(plan)), ElementsAre(plan[2], plan[4]));
  deal.PutBack(std::move(progress));
  EXPECT_TRUE(deal.AnyDone());
  EXPECT_EQ(deal.ranks()[0].reported.count(), 1u);
}

}  // namespace
}  // namespace samplerd
