#include "kernels/internal/shuffle.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace internal {
namespace {

using testutil::ChiSquarePValue;

using plan_math::ShuffleBucketBits;

// The definition in shuffle.h, written as plainly as possible (one Philox block per word, one
// level of partition).
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

// Sizes on both sides of the one-bucket path (1024) and of bucket-count changes (the two-level
// path, beyond 2^24 inputs, has its own test below); thread counts that split the inputs at
// positions that are not multiples of 4 (one Philox block holds the buckets of 4 inputs).
TEST(ShuffleTest, RangeEqualsDefinitionForAnyThreadCount) {
  for (uint64_t m : {uint64_t{1}, uint64_t{2}, uint64_t{100}, uint64_t{1023}, uint64_t{1024},
                     uint64_t{1025}, uint64_t{65537}, uint64_t{1'000'003}}) {
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

// The two-level partition (pass A by the top bits, pass B by the rest) against the one-level
// reference: small inputs with the first pass forced down to 1-5 bits (and to b - 1), so that
// both levels, top-level buckets of every size and sub-buckets of 1 to 2^9 run here in
// milliseconds.
TEST(ShuffleTest, TwoLevelPartitionEqualsOneLevelDefinition) {
  for (uint64_t m :
       {uint64_t{1025}, uint64_t{3000}, uint64_t{40'000}, uint64_t{131'073}, uint64_t{1'000'003}}) {
    const int bits = ShuffleBucketBits(m);
    const std::vector<uint32_t> want = ReferenceShuffle<uint32_t>(21, 8, Iota(m));
    std::vector<int> splits;
    for (int top_bits = 1; top_bits <= std::min(bits - 1, 5); ++top_bits) {
      splits.push_back(top_bits);
    }
    if (bits > 6) splits.push_back(bits - 1);
    for (int top_bits : splits) {
      for (int threads : {1, 3}) {
        std::vector<uint32_t> got(m);
        ShuffleRange(threads, 21, 8, absl::MakeSpan(got), top_bits);
        ASSERT_EQ(got, want) << "m = " << m << ", top bits " << top_bits << ", threads " << threads;
      }
    }
    // Inputs from an array, 64-bit output.
    std::vector<uint64_t> indices(m);
    for (uint64_t k = 0; k < m; ++k) indices[k] = (uint64_t{1} << 33) + 5 * (m - k);
    const std::vector<uint64_t> want64 = ReferenceShuffle<uint64_t>(21, 8, indices);
    std::vector<uint64_t> got64(m);
    ShuffleIndices(2, 21, 8, absl::MakeConstSpan(indices), absl::MakeSpan(got64), 2);
    ASSERT_EQ(got64, want64) << "m = " << m;
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

TEST(ShuffleTest, GeneratedEqualsIndices) {
  // Inputs computed in blocks give ShuffleIndices' result, each input computed once: one bucket
  // (m = 1000 > one block of 512), one level, and two levels (max_top_bits = 2).
  for (uint64_t m : {1ull, 1000ull, 70'001ull}) {
    std::vector<uint64_t> indices(m);
    for (uint64_t k = 0; k < m; ++k) indices[k] = (uint64_t{1} << 40) + 11 * (m - k);
    for (int top_bits : {kMaxShuffleTopBits, 2}) {
      for (int threads : {1, 3}) {
        std::vector<uint64_t> want(m), got(m);
        ShuffleIndices(threads, 4, 2, absl::MakeConstSpan(indices), absl::MakeSpan(want), top_bits);
        std::vector<std::atomic<int>> calls(m);
        const InputBlockFn inputs = [&](uint64_t k, uint64_t count, uint64_t* values) {
          ASSERT_LE(count, 512u);
          for (uint64_t i = 0; i < count; ++i) {
            values[i] = indices[k + i];
            ++calls[k + i];
          }
        };
        ShuffleGenerated(threads, 4, 2, inputs, absl::MakeSpan(got), top_bits);
        ASSERT_EQ(got, want) << "m = " << m << ", top bits " << top_bits << ", threads " << threads;
        for (uint64_t k = 0; k < m; ++k) ASSERT_EQ(calls[k].load(), 1) << "input " << k;
      }
    }
  }
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
  // m = 3079: 4 buckets of random sizes. For inputs at the start, middle and end, the output
  // position (in 32 bins) is uniform over 6000 epochs; and input 0 precedes input 1 half the time
  // (they share a bucket a quarter of the time).
  const uint64_t m = 3 * 1024 + 7, epochs = 6000, bins = 32;
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

// Every element's output position, through the two-level path (b = 3, the first pass forced to
// 1 bit): over 400 epochs each of the m = 5000 inputs falls in each of 8 position bins 50 times
// on average. One chi-square over all m x 8 cells (m * 7 degrees of freedom; fixed seed), plus
// the worst single input's p-value, Bonferroni-corrected. Also the order of adjacent pairs
// (inputs 2i, 2i+1, which often share a bucket): first half the time.
TEST(ShuffleStatisticsTest, EveryPositionIsUniformThroughTwoLevels) {
  const uint64_t m = 5000, epochs = 400, bins = 8;
  ASSERT_EQ(ShuffleBucketBits(m), 3);
  std::vector<uint64_t> cells(m * bins, 0);
  uint64_t pair_first = 0;
  std::vector<uint32_t> p(m);
  std::vector<uint64_t> where(m);
  for (uint64_t e = 0; e < epochs; ++e) {
    ShuffleRange(2, 4242, e, absl::MakeSpan(p), /*max_top_bits=*/1);
    for (uint64_t pos = 0; pos < m; ++pos) where[p[pos]] = pos;
    for (uint64_t k = 0; k < m; ++k) ++cells[k * bins + where[k] * bins / m];
    for (uint64_t k = 0; k + 1 < m; k += 2) pair_first += where[k] < where[k + 1];
  }
  // Expected counts per cell: epochs x the share of positions in the bin (bins of 625).
  const double expected = static_cast<double>(epochs) / bins;
  double chi2 = 0, worst = 1;
  for (uint64_t k = 0; k < m; ++k) {
    double chi2_k = 0;
    for (uint64_t b = 0; b < bins; ++b) {
      const double d = cells[k * bins + b] - expected;
      chi2_k += d * d / expected;
    }
    chi2 += chi2_k;
    worst = std::min(worst, ChiSquarePValue(chi2_k, bins - 1));
  }
  EXPECT_GT(ChiSquarePValue(chi2, m * (bins - 1)), 1e-3) << "chi2 " << chi2;
  EXPECT_GT(worst * m, 1e-3) << "the least uniform input";
  const double pairs = (m / 2) * epochs;
  const double z = (pair_first - pairs / 2) / std::sqrt(pairs / 4);
  EXPECT_LT(std::fabs(z), 3.29) << pair_first << " of " << pairs;
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
