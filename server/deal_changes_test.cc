// DealChanges: each recorded change of the deal logs, then applies; a change whose record fails
// applies nothing (but stream progress, which is applied and reported). The failing history is a
// real one: a journal with no epoch log open refuses every record.
#include "server/deal_changes.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/epoch_history.h"
#include "server/job_config.h"
#include "server/persistence/job_journal.h"
#include "server/testing/loss_batches.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

float One(uint64_t) { return 1.0f; }

JobConfig Config() {
  v1::JobSpec spec;
  spec.set_num_samples(1000);
  spec.set_world_size(2);
  return *MakeJobConfig(spec, JobLimits());
}

// A journal-backed history whose every record fails: the journal has no epoch log open (it is
// opened when an epoch is published, which this one never was).
class FailingRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Create(dir_.path() + "/j");
    ASSERT_TRUE(journal.ok()) << journal.status();
    history_ = MakeJournalHistory("j", Config(), *std::move(journal));
  }
  testutil::TestDir dir_;
  std::unique_ptr<EpochHistory> history_;
  CurrentDeal deal_{"j", ShardSpec{2}, 10};
};

TEST_F(FailingRecordsTest, AFailedLogWriteAppliesNothing) {
  DealChanges changes(history_.get(), &deal_);
  // Losses: refused, no position reported.
  std::vector<uint64_t> shard = {0, 2, 4, 6, 8};  // Rank 0's positions hold any indices.
  const testutil::OwnedLossBatch batch = testutil::BatchAt(0, 0, 0, shard, {0, 1}, One);
  absl::StatusOr<CurrentDeal::NewLosses> reported =
      changes.Reported(batch.view(), history_->PrepareLosses(batch.view()));
  EXPECT_EQ(reported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reported.status().message()), HasSubstr("no epoch log open"));
  EXPECT_EQ(deal_.ranks()[0].reported.count(), 0u);
  EXPECT_FALSE(deal_.AnyDone());
  // A rank's end of the epoch: refused, not ended.
  EXPECT_EQ(changes.Ended(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(deal_.ranks()[1].ended);
  EXPECT_EQ(deal_.ranks_ended(), 0u);
  // A resize's deal: refused, the deal as it was.
  EXPECT_EQ(changes.Redealt(0, 4, 10, false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(deal_.number(), 0u);
  EXPECT_EQ(deal_.world_size(), 2u);
  EXPECT_FALSE(deal_.Started());
  // Stream progress: the positions were handed out, so it is applied; the failure is reported.
  EXPECT_EQ(changes.Streamed(0, 0, 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(deal_.ranks()[0].streamed, 3u);
  EXPECT_TRUE(deal_.Started());
}

TEST(DealChangesTest, EachRecordedChangeIsApplied) {
  std::unique_ptr<EpochHistory> history = MakeInMemoryHistory("j", Config());
  CurrentDeal deal("j", ShardSpec{2}, 10);
  DealChanges changes(history.get(), &deal);
  std::vector<uint64_t> shard = {0, 2, 4, 6, 8};
  const testutil::OwnedLossBatch batch = testutil::BatchAt(0, 0, 0, shard, {0, 1}, One);
  absl::StatusOr<CurrentDeal::NewLosses> reported =
      changes.Reported(batch.view(), history->PrepareLosses(batch.view()));
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_EQ(reported->size(), 2u);
  EXPECT_EQ(deal.ranks()[0].reported.count(), 2u);
  ASSERT_TRUE(changes.Ended(0, 1).ok());
  EXPECT_EQ(deal.ranks_ended(), 1u);
  ASSERT_TRUE(changes.Redealt(0, 4, 8, true).ok());
  EXPECT_EQ(deal.number(), 1u);
  EXPECT_EQ(deal.world_size(), 4u);
  EXPECT_EQ(deal.ranks_ended(), 0u);
}

}  // namespace
}  // namespace samplerd
