#include "kernels/mixture/group_losses.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace mixture {
namespace {

GroupLayout Layout(std::vector<uint64_t> sizes) {
  absl::StatusOr<GroupLayout> layout = GroupLayout::Create(sizes);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

TEST(GroupLossesTest, GroupOfIsTheOffsetsRange) {
  const GroupLayout layout = Layout({3, 1, 4});
  const std::vector<uint32_t> want = {0, 0, 0, 1, 2, 2, 2, 2};
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(layout.GroupOf(i), want[i]) << "index " << i;
  const GroupLayout big = Layout({uint64_t{1} << 62, 5, (uint64_t{1} << 62) - 5});
  EXPECT_EQ(big.GroupOf((uint64_t{1} << 62) - 1), 0u);
  EXPECT_EQ(big.GroupOf(uint64_t{1} << 62), 1u);
  EXPECT_EQ(big.GroupOf((uint64_t{1} << 62) + 5), 2u);
  EXPECT_EQ(big.GroupOf(big.total() - 1), 2u);
}

TEST(GroupLossesTest, CountsAndMeansByHand) {
  const GroupLayout layout = Layout({3, 1, 4});
  GroupLosses losses(3);
  ASSERT_TRUE(losses.Add(layout, {0, 2, 4, 7, 5}, {1.5f, 2.5f, 0.25f, 1.0f, 0.5f}).ok());
  EXPECT_EQ(losses.count(0), 2u);
  EXPECT_EQ(losses.count(1), 0u);
  EXPECT_EQ(losses.count(2), 3u);
  EXPECT_EQ(losses.Mean(0), 2.0);
  EXPECT_EQ(losses.Mean(2), 1.75 / 3);  // 0.25 + 1 + 0.5, one division.
  EXPECT_EQ(losses.fixed_sum(0), static_cast<unsigned __int128>(4) << 32);
  // A loss below 2^-32 counts as 0; 0.1f keeps its bits above 2^-32 (truncated below).
  GroupLosses tiny(3);
  ASSERT_TRUE(tiny.Add(layout, {3, 3}, {1e-10f, 0.1f}).ok());
  EXPECT_EQ(tiny.fixed_sum(1), static_cast<uint64_t>(static_cast<double>(0.1f) * 4294967296.0));
}

TEST(GroupLossesTest, ArrivalOrderBatchingAndMergingDoNotChangeTheBits) {
  const GroupLayout layout = Layout({1000, 7, 50'000, 1, 123});
  std::mt19937_64 rng(35);
  std::vector<uint64_t> indices(40'000);
  std::vector<float> values(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    indices[i] = rng() % layout.total();
    values[i] = std::ldexp(static_cast<float>(rng() % 1'000'000), -static_cast<int>(rng() % 30));
  }
  GroupLosses one(5);
  ASSERT_TRUE(one.Add(layout, indices, values).ok());
  // Reversed, in batches of 333, split over two "threads" merged.
  std::vector<uint64_t> ri(indices.rbegin(), indices.rend());
  std::vector<float> rv(values.rbegin(), values.rend());
  GroupLosses a(5), b(5);
  for (size_t s = 0; s < ri.size(); s += 333) {
    const size_t e = std::min(ri.size(), s + 333);
    GroupLosses& into = (s / 333) % 2 ? a : b;
    ASSERT_TRUE(into.Add(layout, absl::MakeConstSpan(ri).subspan(s, e - s),
                         absl::MakeConstSpan(rv).subspan(s, e - s))
                    .ok());
  }
  a.Merge(b);
  for (uint32_t k = 0; k < 5; ++k) {
    ASSERT_EQ(a.count(k), one.count(k)) << "group " << k;
    ASSERT_TRUE(a.fixed_sum(k) == one.fixed_sum(k)) << "group " << k;
    if (one.count(k) > 0) {
      EXPECT_EQ(a.Mean(k), one.Mean(k));
      // Against a long-double sum of the truncated terms: within rounding.
      long double sum = 0;
      for (size_t i = 0; i < indices.size(); ++i) {
        if (layout.GroupOf(indices[i]) == k) {
          sum += std::floor(static_cast<long double>(values[i]) * 4294967296.0L);
        }
      }
      EXPECT_NEAR(one.Mean(k), static_cast<double>(sum / 4294967296.0L / one.count(k)),
                  1e-15 * one.Mean(k) + 1e-300);
    }
  }
}

TEST(GroupLossesTest, BadInputIsNamedAndChangesNothing) {
  const GroupLayout layout = Layout({3, 1, 4});
  GroupLosses losses(3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<uint64_t> indices;
    std::vector<float> values;
    const char* want;
  };
  const std::vector<Case> cases = {
      {{0, 8}, {1.0f, 1.0f}, "indices[1] = 8: not below the job's 8 samples"},
      {{0, 1}, {1.0f, nan}, "losses[1] = nan (index 1)"},
      {{0, 1}, {1.0f, -0.5f}, "losses[1] = -0.5"},
      {{2}, {std::numeric_limits<float>::infinity()}, "losses[0] = inf"},
      {{2},
       {4294967296.0f},
       "losses[0] = 4.29497e+09 (index 2): a mixture job's losses are "
       "finite, >= 0 and below 2^32"},
      {{0, 1}, {1.0f}, "losses: 1 losses for 2 indices"},
  };
  for (const Case& c : cases) {
    const absl::Status s = losses.Add(layout, c.indices, c.values);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.message();
  }
  for (uint32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(losses.count(k), 0u);
    EXPECT_TRUE(losses.fixed_sum(k) == 0);
  }
}

}  // namespace
}  // namespace mixture
}  // namespace samplerd
