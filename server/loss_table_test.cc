#include "server/loss_table.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LossTableTest, FirstLossSetsTheEmaThenItDecays) {
  LossTable table(4, 0.75);
  EXPECT_TRUE(table.Apply(2, 4.0f, 0));
  EXPECT_FALSE(table.Apply(2, 8.0f, 1));
  const LossStatsView stats = table.View();
  ASSERT_EQ(stats.size(), 4u);
  EXPECT_FLOAT_EQ(stats[2].ema_loss, 0.75f * 4.0f + 0.25f * 8.0f);
  EXPECT_EQ(stats[2].count, 2u);
  EXPECT_EQ(stats[2].last_epoch, 2u);  // Epoch 1, stored + 1.
  EXPECT_EQ(stats[0].count, 0u);
  EXPECT_EQ(stats[0].last_epoch, 0u);  // Never seen.
  EXPECT_EQ(table.SamplesSeen(), 1u);
}

}  // namespace
}  // namespace samplerd
