#include "server/loss_table.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LossTableTest, OneLossPerSamplePerEpochIntoTheEma) {
  LossTable table(4, 0.75);
  bool first = false;
  EXPECT_TRUE(table.Apply(2, 4.0f, 0, &first));
  EXPECT_TRUE(first);
  EXPECT_FALSE(table.Apply(2, 100.0f, 0, &first));  // Same epoch: a duplicate, ignored.
  EXPECT_TRUE(table.Apply(2, 8.0f, 1, &first));
  EXPECT_FALSE(first);
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

}  // namespace
}  // namespace samplerd
