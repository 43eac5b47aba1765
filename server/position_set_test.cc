#include "server/position_set.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(PositionSetTest, InsertReportsNewOnlyOnce) {
  PositionSet set;
  EXPECT_FALSE(set.Contains(5));
  EXPECT_TRUE(set.Insert(5, 130));
  EXPECT_FALSE(set.Insert(5, 130));
  EXPECT_TRUE(set.Contains(5));
  EXPECT_FALSE(set.Contains(4));
  EXPECT_TRUE(set.Insert(129, 130));  // The last position, in the third word.
  EXPECT_TRUE(set.Contains(129));
  EXPECT_EQ(set.count(), 2u);
}

TEST(PositionSetTest, CountsEveryPositionOnceUpToAFullShard) {
  PositionSet set;
  for (uint64_t p = 0; p < 100; ++p) EXPECT_TRUE(set.Insert(p, 100));
  for (uint64_t p = 0; p < 100; ++p) EXPECT_FALSE(set.Insert(p, 100));
  EXPECT_EQ(set.count(), 100u);
}

TEST(PositionSetTest, BytesForRoundsUpToWords) {
  EXPECT_EQ(PositionSet::BytesFor(0), 0u);
  EXPECT_EQ(PositionSet::BytesFor(1), 8u);
  EXPECT_EQ(PositionSet::BytesFor(64), 8u);
  EXPECT_EQ(PositionSet::BytesFor(65), 16u);
}

}  // namespace
}  // namespace samplerd
