#include "kernels/internal/shuffle.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace internal {
namespace {

using testutil::ChiSquarePValue;

// The definition in shuffle.h, written as plainly as possible (one Philox block per word).
template <typename T>
std::vector<T> ReferenceShuffle(uint64_t seed, uint64_t epoch, const std::vector<uint64_t>& in) {
  const int bits = ShuffleBucketBits(in.size());
  std::vector<std::vector<uint64_t>> buckets(size_t{1} << bits);
  for (uint64_t k = 0; k < in.size(); ++k) {
    const uint32_t word = RandomBlock(seed, epoch, RandomStream::kShuffle, k / 4).v[k % 4];
    buckets[bits == 0 ? 0 : word >> (32 - bits)].push_back(in[k]);
  }
  std::vector<T> out;
  for (uint64_t b = 0; b < buckets.size(); ++b) {
    std::vector<uint64_t>& a = buckets[b];
    uint64_t t = 0;
    auto next_word = [&] {
      const uint32_t u =
          RandomBlock(seed, epoch, RandomStream::kShuffleSwap, (b << 40) + t / 4).v[t % 4];
      ++t;
      return u;
    };
    for (uint64_t i = a.size() - 1; a.size() > 1 && i > 0; --i) {
      const uint64_t range = i + 1;
      uint64_t product;
      do {
        product = next_word() * range;
      } while ((product & 0xffffffffu) < ((uint64_t{1} << 32) % range));
      std::swap(a[i], a[product >> 32]);
    }
    for (uint64_t x : a) out.push_back(static_cast<T>(x));
  }
  return out;
}

std::vector<uint64_t> Iota(uint64_t m) {
  std::vector<uint64_t> v(m);
  for (uint64_t k = 0; k < m; ++k) v[k] = k;
  return v;
}

TEST(ShuffleTest, BucketBits) {
  EXPECT_EQ(ShuffleBucketBits(0), 0);
  EXPECT_EQ(ShuffleBucketBits(4096), 0);
  EXPECT_EQ(ShuffleBucketBits(4097), 1);
  EXPECT_EQ(ShuffleBucketBits(8192), 1);
  EXPECT_EQ(ShuffleBucketBits(8193), 2);
  EXPECT_EQ(ShuffleBucketBits(10'000'000), 12);
  EXPECT_EQ(ShuffleBucketBits(uint64_t{1} << 24), 12);
  EXPECT_EQ(ShuffleBucketBits(uint64_t{1} << 40), 12);
}

// Sizes on both sides of the one-bucket path (4096) and of bucket-count changes; thread counts
// that split the inputs at positions that are not multiples of 4 (one Philox block holds the
// buckets of 4 inputs).
TEST(ShuffleTest, RangeEqualsDefinitionForAnyThreadCount) {
  for (uint64_t m : {uint64_t{1}, uint64_t{2}, uint64_t{100}, uint64_t{4095}, uint64_t{4096},
                     uint64_t{4097}, uint64_t{65537}, uint64_t{1'000'003}}) {
    const std::vector<uint32_t> want = ReferenceShuffle<uint32_t>(11, 4, Iota(m));
    for (int threads : {1, 3, 4}) {
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

TEST(ShuffleTest, IndicesEqualsDefinition) {
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

TEST(ShuffleTest, EpochsGiveDifferentPermutations) {
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

// Chi-square p-value of counts against equal expected counts.
double UniformPValue(const std::vector<uint64_t>& counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  const double expected = static_cast<double>(total) / counts.size();
  double chi2 = 0;
  for (uint64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  return ChiSquarePValue(chi2, counts.size() - 1);
}

TEST(ShuffleStatisticsTest, AllPermutationsOfFourAreEquallyLikely) {
  // One bucket: Fisher-Yates with Lemire draws. 24 permutations, 96000 epochs.
  std::map<std::vector<uint32_t>, uint64_t> seen;
  for (uint64_t e = 0; e < 96'000; ++e) {
    std::vector<uint32_t> p(4);
    ShuffleRange(1, 2024, e, absl::MakeSpan(p));
    ++seen[p];
  }
  ASSERT_EQ(seen.size(), 24u);
  std::vector<uint64_t> counts;
  for (const auto& [p, c] : seen) counts.push_back(c);
  EXPECT_GT(UniformPValue(counts), 1e-3);
}

TEST(ShuffleStatisticsTest, PositionsAreUniformAcrossBuckets) {
  // m = 12295: 4 buckets of random sizes. For inputs at the start, middle and end, the output
  // position (in 32 bins) is uniform over 6000 epochs; and input 0 precedes input 1 half the time
  // (they share a bucket a quarter of the time).
  const uint64_t m = 3 * 4096 + 7, epochs = 6000, bins = 32;
  ASSERT_EQ(ShuffleBucketBits(m), 2);
  const uint64_t tracked[] = {0, m / 2, m - 1};
  std::vector<std::vector<uint64_t>> position_bins(3, std::vector<uint64_t>(bins, 0));
  uint64_t zero_first = 0;
  std::vector<uint32_t> p(m);
  std::vector<uint64_t> where(m);
  for (uint64_t e = 0; e < epochs; ++e) {
    ShuffleRange(2, 77, e, absl::MakeSpan(p));
    for (uint64_t pos = 0; pos < m; ++pos) where[p[pos]] = pos;
    for (int t = 0; t < 3; ++t) ++position_bins[t][where[tracked[t]] * bins / m];
    zero_first += where[0] < where[1];
  }
  for (int t = 0; t < 3; ++t) {
    EXPECT_GT(UniformPValue(position_bins[t]), 1e-3) << "input " << tracked[t];
  }
  // Binomial(6000, 1/2): |z| < 3.29 is p > 1e-3.
  const double z = (zero_first - epochs / 2.0) / std::sqrt(epochs / 4.0);
  EXPECT_LT(std::fabs(z), 3.29) << zero_first << " of " << epochs;
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
