// Plan storage (plan.h): 4-byte indices up to N = 2^32, 8-byte beyond, read back alike.
#include "kernels/plan.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(PlanTest, IndexWidthFollowsNumSamples) {
  EXPECT_TRUE(Plan::Narrow(1));
  EXPECT_TRUE(Plan::Narrow(uint64_t{1} << 32));  // Indices up to 2^32 - 1 fit in 32 bits.
  EXPECT_FALSE(Plan::Narrow((uint64_t{1} << 32) + 1));

  Plan narrow;
  narrow.num_samples = 10;
  narrow.indices32 = {7, 3, 9};
  EXPECT_EQ(narrow.size(), 3u);
  EXPECT_EQ(narrow[2], 9u);

  Plan wide;
  wide.num_samples = 5'000'000'000ull;
  wide.indices64 = {4'999'999'999ull, 0};
  EXPECT_EQ(wide.size(), 2u);
  EXPECT_EQ(wide[0], 4'999'999'999ull);
}

TEST(PlanSpecTest, EveryIndexOnceOnlyWithoutReplacementAndMEqualsN) {
  EXPECT_TRUE((PlanSpec{10, 10, 0, false}).EveryIndexOnce());
  EXPECT_FALSE((PlanSpec{10, 10, 0, true}).EveryIndexOnce());
  EXPECT_FALSE((PlanSpec{10, 9, 0, false}).EveryIndexOnce());
}

}  // namespace
}  // namespace samplerd
