#include "kernels/loss_groups.h"

#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LossGroupsTest, GroupsAreTheDistinctWeightsInKeyOrderWithTheirCounts) {
  const std::vector<float> base = {2, 0.5f, 2, -0.0f, 0, 0.5f, 2};
  LossGroupTable t;
  ASSERT_TRUE(FindLossGroups(base.data(), base.size(), 10, &t));
  // -0 and +0 are one group (key 0); keys ascend like the non-negative floats.
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.keys[0], 0u);
  EXPECT_EQ(t.keys[1], weight_math::FloatBits(0.5f));
  EXPECT_EQ(t.keys[2], weight_math::FloatBits(2.0f));
  EXPECT_EQ(t.counts, (std::vector<uint64_t>{2, 2, 3}));
  for (size_t i = 0; i < base.size(); ++i) {
    const uint32_t g =
        weight_math::GroupOf(t.keys.data(), t.size(), weight_math::GroupKey(base[i]));
    EXPECT_EQ(t.keys[g], weight_math::GroupKey(base[i])) << i;
  }
}

TEST(LossGroupsTest, MoreGroupsThanAllowedIsRefused) {
  const std::vector<float> base = {1, 2, 3, 1};
  LossGroupTable t;
  EXPECT_FALSE(FindLossGroups(base.data(), base.size(), 2, &t));
  EXPECT_TRUE(FindLossGroups(base.data(), base.size(), 3, &t));
}

TEST(LossGroupsTest, FixedPointMeanOfAGroup) {
  // f = 1 and f = 0.25: units 2^40 and 2^38, mean 0.625 exactly.
  uint64_t low = 0, high = 0;
  for (float f : {1.0f, 0.25f}) {
    low += weight_math::GroupFactorLow(weight_math::GroupFactorUnits(f));
    high += weight_math::GroupFactorHigh(weight_math::GroupFactorUnits(f));
  }
  EXPECT_EQ(weight_math::GroupFactorMean(high, low, 2), 0.625);
  // A factor below 2^-40 counts as 0 in the sum (its group's largest has f = 1).
  EXPECT_EQ(weight_math::GroupFactorUnits(0x1p-41f), 0u);
}

}  // namespace
}  // namespace samplerd
