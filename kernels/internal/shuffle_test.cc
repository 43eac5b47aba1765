#include "kernels/internal/shuffle.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace internal {
namespace {

// The definition: sort (ShuffleKey, index) pairs.
template <typename T>
std::vector<T> ReferenceShuffle(uint64_t seed, uint64_t epoch,
                                const std::vector<uint64_t>& indices) {
  std::vector<std::pair<uint64_t, uint64_t>> pairs;
  for (uint64_t i : indices) pairs.emplace_back(ShuffleKey(seed, epoch, i), i);
  std::sort(pairs.begin(), pairs.end());
  std::vector<T> out;
  for (const auto& p : pairs) out.push_back(static_cast<T>(p.second));
  return out;
}

std::vector<uint64_t> Iota(uint64_t m) {
  std::vector<uint64_t> v(m);
  for (uint64_t k = 0; k < m; ++k) v[k] = k;
  return v;
}

// Sizes on both sides of the small-input path (4096) and of bucket-count changes; 3e6 has
// ~1500 buckets of ~2000 indices, where equal 32-bit sub-keys (the full-key tie path) occur
// with probability ~0.5 per run of this test.
TEST(ShuffleTest, RangeEqualsSortByKeyForAnyThreadCount) {
  for (uint64_t m : {uint64_t{1}, uint64_t{2}, uint64_t{100}, uint64_t{4095}, uint64_t{4096},
                     uint64_t{5000}, uint64_t{65537}, uint64_t{1'000'003}, uint64_t{3'000'000}}) {
    const std::vector<uint32_t> want = ReferenceShuffle<uint32_t>(11, 4, Iota(m));
    for (int threads : {1, 4}) {
      std::vector<uint32_t> got(m);
      ShuffleRange(threads, 11, 4, absl::MakeSpan(got));
      ASSERT_EQ(got, want) << "m = " << m << ", threads = " << threads;
    }
    if (m <= 65537) {  // 64-bit output: the same order.
      std::vector<uint64_t> got64(m);
      ShuffleRange(2, 11, 4, absl::MakeSpan(got64));
      ASSERT_EQ(got64, std::vector<uint64_t>(want.begin(), want.end())) << "m = " << m;
    }
  }
}

TEST(ShuffleTest, IndicesEqualsSortByKey) {
  // Scattered indices, some beyond 2^32 (64-bit output), in a non-sorted input order.
  std::vector<uint64_t> indices;
  uint64_t s = 5;
  for (int k = 0; k < 50'000; ++k) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    indices.push_back((s >> 20) * 50'000 + k);  // Distinct: k is the residue.
  }
  const std::vector<uint64_t> want = ReferenceShuffle<uint64_t>(3, 9, indices);
  for (int threads : {1, 4}) {
    std::vector<uint64_t> got(indices.size());
    ShuffleIndices(threads, 3, 9, absl::MakeConstSpan(indices), absl::MakeSpan(got));
    ASSERT_EQ(got, want) << "threads = " << threads;
  }
  // 32-bit output of indices below 2^32.
  std::vector<uint64_t> small(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) small[k] = 7 * k + 3;
  std::vector<uint32_t> got32(small.size());
  ShuffleIndices(2, 3, 9, absl::MakeConstSpan(small), absl::MakeSpan(got32));
  EXPECT_EQ(got32, ReferenceShuffle<uint32_t>(3, 9, small));
}

TEST(ShuffleTest, EpochsGiveDifferentOrders) {
  std::vector<uint32_t> a(10000), b(10000);
  ShuffleRange(2, 1, 0, absl::MakeSpan(a));
  ShuffleRange(2, 1, 1, absl::MakeSpan(b));
  EXPECT_NE(a, b);
  std::sort(b.begin(), b.end());
  for (uint32_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], k);
}

TEST(ShuffleTest, EmptyIsFine) {
  std::vector<uint32_t> none;
  ShuffleRange(2, 1, 0, absl::MakeSpan(none));
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
