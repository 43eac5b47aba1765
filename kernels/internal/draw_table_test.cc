#include "kernels/internal/draw_table.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace internal {
namespace {

using testutil::RandomWeights;

// Most weight on a few samples, the rest tiny: guide buckets then span many samples, so draws
// need more than the four branch-free steps.
std::vector<float> HeavyTailedWeights(uint64_t n) {
  std::vector<float> w(n, 1e-30f);
  for (uint64_t i = 0; i < n; i += 97) w[i] = 1e30f;
  for (uint64_t i = 5; i < n; i += 13) w[i] = 0.0f;
  w[n - 1] = 1e-30f;
  return w;
}

TEST(DrawTableTest, GuideTableEqualsBinarySearch) {
  std::vector<std::vector<float>> cases;
  for (uint64_t n : {1, 2, 3, 5, 1000, 65537}) cases.push_back(RandomWeights(n, n, 0.3));
  cases.push_back(HeavyTailedWeights(10000));
  cases.push_back({0, 0, 3, 0});
  for (const std::vector<float>& w : cases) {
    if (std::none_of(w.begin(), w.end(), [](float x) { return x > 0; })) continue;
    const DrawTable table = BuildDrawTable(2, w);
    for (uint64_t j = 0; j < 50000; ++j) {
      const uint64_t r = RandomBits64(11, 2, RandomStream::kDraw, j);
      ASSERT_EQ(DrawByGuide(table, r), DrawByBinarySearch(table, r))
          << "n = " << w.size() << ", j = " << j;
    }
    // The extremes of r.
    for (uint64_t r : {uint64_t{0}, ~uint64_t{0}, uint64_t{1} << 63}) {
      ASSERT_EQ(DrawByGuide(table, r), DrawByBinarySearch(table, r)) << "r = " << r;
    }
  }
}

TEST(DrawTableTest, BatchDrawsEqualOneByOneForAnyThreadCount) {
  for (const std::vector<float>& w : {RandomWeights(100'000, 4, 0.2), HeavyTailedWeights(50'000)}) {
    const uint64_t count = 300'001;
    for (int threads : {1, 4}) {
      const DrawTable table = BuildDrawTable(threads, w);
      std::vector<uint32_t> out(count);
      DrawWeighted(threads, table, 8, 3, 1000, absl::MakeSpan(out));
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t want =
            DrawByBinarySearch(table, RandomBits64(8, 3, RandomStream::kDraw, 1000 + k));
        ASSERT_EQ(out[k], want) << "k = " << k << ", threads = " << threads;
        ASSERT_GT(w[out[k]], 0.0f) << "zero-weight sample drawn";
      }
    }
  }
}

TEST(DrawTableTest, TableDoesNotDependOnThreads) {
  const std::vector<float> w = RandomWeights(300'000, 9, 0.1);
  const DrawTable a = BuildDrawTable(1, w), b = BuildDrawTable(4, w);
  ASSERT_EQ(a.total, b.total);
  ASSERT_TRUE(std::equal(a.prefix.begin(), a.prefix.begin() + w.size() + 1, b.prefix.begin()));
  EXPECT_EQ(a.guide, b.guide);
}

TEST(DrawTableTest, QuantisationKeepsTinyPositiveWeights) {
  const std::vector<float> w = {1e30f, 1e-30f, 0.0f, 1.0f};
  const std::vector<uint64_t> q = QuantiseWeights(1, w);
  EXPECT_GT(q[0], uint64_t{1} << 50);
  EXPECT_EQ(q[1], 1u);  // A positive weight is never silently dropped.
  EXPECT_EQ(q[2], 0u);
  EXPECT_GE(q[3], 1u);
  uint64_t total = 0;
  for (uint64_t x : q) total += x;
  EXPECT_LT(total, uint64_t{1} << 63);
  // The scale is a power of two: quantisation of exactly representable ratios is exact.
  const std::vector<uint64_t> q2 = QuantiseWeights(2, {1.0f, 2.0f, 0.5f});
  EXPECT_EQ(q2[1], 2 * q2[0]);
  EXPECT_EQ(q2[0], 2 * q2[2]);
}

TEST(DrawTableTest, UniformDrawsCoverTheRange) {
  const uint64_t n = 5'000'000'000ull;  // Beyond 2^32.
  std::vector<uint64_t> out(100'000);
  DrawUniform(2, 1, 2, n, 7, absl::MakeSpan(out));
  uint64_t above = 0;
  for (uint64_t k = 0; k < out.size(); ++k) {
    ASSERT_EQ(out[k], UniformDraw(1, 2, n, 7 + k));
    ASSERT_LT(out[k], n);
    above += out[k] >> 32 != 0;
  }
  EXPECT_GT(above, out.size() / 10);  // ~14% of [0, 5e9) lies above 2^32.
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
