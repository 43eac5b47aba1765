// The plan side's per-element rules (plan_math.h) against their definitions in docs/SAMPLING.md,
// as host code. reference_test (kernels/cuda) checks the same rules against the CPU backend's
// plans, and identity_test the device against them.
#include "kernels/plan_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/det_math.h"
#include "kernels/philox.h"

namespace samplerd {
namespace plan_math {
namespace {

TEST(PlanMathTest, BitWidth) {
  EXPECT_EQ(BitWidth(0), 0);
  EXPECT_EQ(BitWidth(1), 1);
  EXPECT_EQ(BitWidth(255), 8);
  EXPECT_EQ(BitWidth(256), 9);
  EXPECT_EQ(BitWidth(~uint64_t{0}), 64);
}

TEST(PlanMathTest, EsKeyIsTheDefinition) {
  const double u = det::UniformOpen01(RandomBits64(5, 6, RandomStream::kEsKey, 7));
  EXPECT_EQ(EsKeyBits(5, 6, 7, 2.5f), det::Bits(-det::Log2(u) / 2.5));
  EXPECT_EQ(EsKeyBits(5, 6, 7, 0.0f), det::Bits(INFINITY));
  EXPECT_EQ(EsKeyBits(5, 6, 7, -0.0f), det::Bits(INFINITY));
  EXPECT_EQ(EsKeyBits(5, 6, 7, -1.0f), kInfinityKeyBits);
  EXPECT_EQ(kInfinityKeyBits, det::Bits(INFINITY));
}

TEST(PlanMathTest, BucketBitsGiveBucketsOfAtMost1024OnAverage) {
  EXPECT_EQ(ShuffleBucketBits(0), 0);
  EXPECT_EQ(ShuffleBucketBits(1), 0);
  EXPECT_EQ(ShuffleBucketBits(1024), 0);
  EXPECT_EQ(ShuffleBucketBits(1025), 1);
  EXPECT_EQ(ShuffleBucketBits(2048), 1);
  EXPECT_EQ(ShuffleBucketBits(2049), 2);
  EXPECT_EQ(ShuffleBucketBits(10'000'000), 14);  // 610 inputs per bucket.
  EXPECT_EQ(ShuffleBucketBits(1000000000), 20);  // 954 inputs per bucket.
  EXPECT_EQ(ShuffleBucketBits(uint64_t{1} << 31), 21);
  EXPECT_EQ(ShuffleBucketBits(kMaxShuffleInputs), 24);
  EXPECT_EQ(ShuffleBucketBits(kMaxShuffleInputs + 1), 25);  // Beyond the limit.
  EXPECT_EQ(ShuffleBucketBits(uint64_t{1} << 40), 30);
  EXPECT_EQ(kMaxShuffleInputs, uint64_t{1} << 34);
}

TEST(PlanMathTest, SwapWordsFollowTheDefinition) {
  // u_t = word t mod 4 of RandomBlock(seed, epoch, 4, B * 2^40 + t / 4).
  SwapWords words(9, 4, 77);
  for (uint64_t t = 0; t < 12; ++t) {
    const Philox4x32Counter block =
        RandomBlock(9, 4, RandomStream::kShuffleSwap, (uint64_t{77} << 40) + t / 4);
    EXPECT_EQ(words.Next(), block.v[t % 4]) << t;
  }
}

TEST(PlanMathTest, SwapTargetIsInRange) {
  SwapWords words(1, 2, 3);
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_LE(words.SwapTarget(i), i);
}

TEST(PlanMathTest, BucketOfIsTheTopBitsOfTheShuffleWord) {
  for (uint64_t k = 0; k < 16; ++k) {
    const uint32_t word = RandomBlock(5, 6, RandomStream::kShuffle, k / 4).v[k % 4];
    EXPECT_EQ(ShuffleBucketOf(5, 6, 20, k), word >> 12);
    EXPECT_EQ(ShuffleBucketOf(5, 6, 0, k), 0u);
  }
}

TEST(PlanMathTest, QuantisationKeepsPositiveWeightsAndTheSumBelow2To63) {
  EXPECT_EQ(Quantise(0.0f, 1024.0), 0u);
  EXPECT_EQ(Quantise(1e-30f, 1024.0), 1u);  // Positive: never dropped.
  EXPECT_EQ(Quantise(2.75f, 4.0), 11u);
  // n = 1000 weights (BitWidth 10) of at most 3.0 (< 2^2): s = 62 - 10 - 2 = 50.
  float w = 3.0f;
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof bits);
  EXPECT_EQ(QuantisationScale(1000, bits), std::ldexp(1.0, 50));
  EXPECT_LT(1000.0 * Quantise(w, QuantisationScale(1000, bits)), std::ldexp(1.0, 63));
}

TEST(PlanMathTest, ShardLengths) {
  // M = 10, R = 4: pad ceil = 3, drop_last floor = 2, uneven 3 3 2 2.
  for (PartitionMode p : {PartitionMode::kInterleaved, PartitionMode::kContiguous}) {
    for (uint32_t rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(ShardLength(10, ShardSpec{4, p, UnevenMode::kPad}, rank), 3u);
      EXPECT_EQ(ShardLength(10, ShardSpec{4, p, UnevenMode::kDropLast}, rank), 2u);
      EXPECT_EQ(ShardLength(10, ShardSpec{4, p, UnevenMode::kUneven}, rank), rank < 2 ? 3u : 2u);
    }
  }
  EXPECT_EQ(ShardLength(3, ShardSpec{5, PartitionMode::kInterleaved, UnevenMode::kPad}, 4), 1u);
  EXPECT_EQ(ShardLength(3, ShardSpec{5, PartitionMode::kInterleaved, UnevenMode::kDropLast}, 0),
            0u);
}

TEST(PlanMathTest, ShardPositionsAreTheDocumentedLayouts) {
  const auto positions = [](const ShardSpec& spec, uint32_t rank) {
    std::vector<uint64_t> out;
    for (uint64_t k = 0; k < ShardLength(10, spec, rank); ++k) {
      out.push_back(ShardPlanPosition(10, spec, rank, k));
    }
    return out;
  };
  using V = std::vector<uint64_t>;
  const PartitionMode kI = PartitionMode::kInterleaved, kC = PartitionMode::kContiguous;
  EXPECT_EQ(positions(ShardSpec{4, kI, UnevenMode::kPad}, 1), (V{1, 5, 9}));
  EXPECT_EQ(positions(ShardSpec{4, kI, UnevenMode::kPad}, 3), (V{3, 7, 1}));  // 11 wraps to 1.
  EXPECT_EQ(positions(ShardSpec{4, kI, UnevenMode::kDropLast}, 3), (V{3, 7}));
  EXPECT_EQ(positions(ShardSpec{4, kC, UnevenMode::kPad}, 3), (V{9, 0, 1}));  // 10, 11 wrap.
  EXPECT_EQ(positions(ShardSpec{4, kC, UnevenMode::kDropLast}, 3), (V{6, 7}));
  EXPECT_EQ(positions(ShardSpec{4, kC, UnevenMode::kUneven}, 1), (V{3, 4, 5}));
  EXPECT_EQ(positions(ShardSpec{4, kC, UnevenMode::kUneven}, 2), (V{6, 7}));
}

// kUneven deals every plan position exactly once, in either partition; kPad and kDropLast give
// every rank the same length.
TEST(PlanMathTest, UnevenShardsCoverThePlanOnce) {
  for (uint64_t m = 1; m <= 40; ++m) {
    for (uint32_t r = 1; r <= 7; ++r) {
      for (PartitionMode p : {PartitionMode::kInterleaved, PartitionMode::kContiguous}) {
        std::vector<int> seen(m, 0);
        uint64_t total = 0;
        const ShardSpec spec{r, p, UnevenMode::kUneven};
        for (uint32_t rank = 0; rank < r; ++rank) {
          const uint64_t length = ShardLength(m, spec, rank);
          total += length;
          for (uint64_t k = 0; k < length; ++k) ++seen[ShardPlanPosition(m, spec, rank, k)];
          EXPECT_EQ(ShardLength(m, ShardSpec{r, p, UnevenMode::kPad}, rank), (m + r - 1) / r);
          EXPECT_EQ(ShardLength(m, ShardSpec{r, p, UnevenMode::kDropLast}, rank), m / r);
        }
        EXPECT_EQ(total, m);
        for (uint64_t i = 0; i < m; ++i) ASSERT_EQ(seen[i], 1) << "m " << m << " R " << r;
      }
    }
  }
}

}  // namespace
}  // namespace plan_math
}  // namespace samplerd
