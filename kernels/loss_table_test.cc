#include "kernels/loss_table.h"

#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LossTableTest, OneLossPerSamplePerEpochIntoTheEma) {
  LossTable table(4, 0.75);
  EXPECT_TRUE(table.Apply(2, 4.0f, 0));
  EXPECT_EQ(table.SamplesSeen(), 1u);
  EXPECT_FALSE(table.Apply(2, 100.0f, 0));  // Same epoch: a duplicate, ignored.
  EXPECT_TRUE(table.Apply(2, 8.0f, 1));
  const absl::Span<const SampleLossStats> stats = table.stats();
  ASSERT_EQ(stats.size(), 4u);
  EXPECT_FLOAT_EQ(stats[2].ema_loss, 0.75f * 4.0f + 0.25f * 8.0f);
  EXPECT_EQ(stats[2].count, 2u);
  EXPECT_EQ(stats[2].last_epoch, EpochMarker(1));
  EXPECT_EQ(stats[0].count, 0u);
  EXPECT_EQ(stats[0].last_epoch, 0u);  // Never seen.
  EXPECT_EQ(table.SamplesSeen(), 1u);
  // The epoch marker wraps after 65535 epochs, never to 0 (= never seen).
  EXPECT_EQ(EpochMarker(65534), 65535);
  EXPECT_EQ(EpochMarker(65535), 1);
}

TEST(LossTableTest, AppliesTheRuleOfLossStats) {
  // The table is ApplyLoss over its entries: the same bits as the rule applied to a copy.
  LossTable table(2, 0.9);
  SampleLossStats want;
  const float losses[] = {3.0f, 0.1f, 7.5f, 1e30f, 0.0f};
  for (uint64_t e = 0; e < 5; ++e) {
    ASSERT_TRUE(ApplyLoss(want, losses[e], EpochMarker(e), 0.9f));
    ASSERT_TRUE(table.Apply(1, losses[e], e));
    EXPECT_EQ(table.stats()[1].ema_loss, want.ema_loss) << e;
    EXPECT_EQ(table.stats()[1].count, want.count);
    EXPECT_EQ(table.stats()[1].last_epoch, want.last_epoch);
  }
}

TEST(LossTableTest, RestoreCountsTheSamplesSeen) {
  LossTable table(3, 0.9);
  std::vector<SampleLossStats> stats(3);
  stats[0].count = 2;
  stats[2].count = 1;
  ASSERT_TRUE(table.Restore(stats).ok());
  EXPECT_EQ(table.SamplesSeen(), 2u);
  EXPECT_EQ(table.stats()[0].count, 2u);
  const absl::Status wrong = table.Restore(std::vector<SampleLossStats>(2));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.SamplesSeen(), 2u);  // Unchanged.
  EXPECT_EQ(table.stats()[0].count, 2u);
  // Nothing: no sample seen.
  ASSERT_TRUE(table.Restore({}).ok());
  EXPECT_EQ(table.SamplesSeen(), 0u);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table.stats()[0].count, 0u);
}

}  // namespace
}  // namespace samplerd
