#include "server/loss_table.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LossTableTest, OneLossPerSamplePerEpochIntoTheEma) {
  LossTable table(4, 0.75);
  EXPECT_TRUE(table.Apply(2, 4.0f, 0));
  EXPECT_EQ(table.SamplesSeen(), 1u);
  EXPECT_FALSE(table.Apply(2, 100.0f, 0));  // Same epoch: a duplicate, ignored.
  EXPECT_TRUE(table.Apply(2, 8.0f, 1));
  const LossStatsView stats = table.View();
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

TEST(LossTableTest, RestoreCountsTheSamplesSeen) {
  LossTable table(3, 0.9);
  std::vector<SampleLossStats> stats(3);
  stats[0].count = 2;
  stats[2].count = 1;
  ASSERT_TRUE(table.Restore(stats).ok());
  EXPECT_EQ(table.SamplesSeen(), 2u);
  EXPECT_EQ(table.View()[0].count, 2u);
  const absl::Status wrong = table.Restore(std::vector<SampleLossStats>(2));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.SamplesSeen(), 2u);  // Unchanged.
}

}  // namespace
}  // namespace samplerd
