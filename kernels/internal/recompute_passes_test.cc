#include "kernels/internal/recompute_passes.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/det_math.h"
#include "kernels/exact_sum.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace internal {
namespace {

using testutil::RandomWeights;

bool Same(const exact_sum::ChunkSum& a, const exact_sum::ChunkSum& b) {
  return a.exponent == b.exponent && a.sum == b.sum;
}

// The chunk sums of the passes are the exact sums of their terms (exact_sum.h): the factors'
// sum equals SumChunk over the factors the pass wrote, the base-times-factor sum SumChunk over
// base_i f_i (in double), and the scan's base sum SumChunk over the base weights.
TEST(RecomputePassesTest, PassSumsAreTheExactSumsOfTheirTerms) {
  const uint64_t n = 2 * kSumChunk + 17;
  const std::vector<float> u = RandomWeights(n, 4, 0.0), base = RandomWeights(n, 5, 0.1);
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) stats[i] = {u[i] * 1e6f * u[i], 1, 1};
  LossFactorParams factors;
  factors.epsilon = 1e-3;
  factors.alpha = 2;
  factors.x_max = 17e6;
  factors.log2_x_max = det::Log2(factors.x_max);
  auto chunk_of = [&](const std::vector<double>& terms, uint64_t c) {
    const std::vector<double> chunk(terms.begin() + c * kSumChunk,
                                    terms.begin() + std::min(n, (c + 1) * kSumChunk));
    return exact_sum::SumChunk(chunk.data(), chunk.size());
  };
  for (const bool with_base : {false, true}) {
    SCOPED_TRACE(with_base ? "with base weights" : "without base weights");
    std::vector<float> out(n);
    const RecomputeArrays arrays{with_base ? base.data() : nullptr, nullptr, stats.data(),
                                 out.data()};
    exact_sum::ChunkSum sums[kChunksPerGroup], base_factor_sums[kChunksPerGroup];
    RawWeightRule loss;
    loss.kind = LossWeightKind::kLoss;
    LossFactorsChunks(BestSimdLevel(), arrays, loss, factors, 0, n, sums,
                      with_base ? base_factor_sums : nullptr);
    std::vector<double> f(n), bf(n);
    for (uint64_t i = 0; i < n; ++i) {
      f[i] = out[i];
      bf[i] = double{base[i]} * double{out[i]};
    }
    for (uint64_t c = 0; c < 3; ++c) {
      EXPECT_TRUE(Same(sums[c], chunk_of(f, c))) << c;
      if (with_base) {
        EXPECT_TRUE(Same(base_factor_sums[c], chunk_of(bf, c))) << c;
      }
    }
    if (!with_base) continue;
    RawWeightRule rule;
    rule.kind = LossWeightKind::kLoss;
    std::vector<ChunkScan> scans(kChunksPerGroup);
    ScanChunks(BestSimdLevel(), arrays, rule, 0, n, scans.data());
    const std::vector<double> b(base.begin(), base.end());
    for (uint64_t c = 0; c < 3; ++c) EXPECT_TRUE(Same(scans[c].base_sum, chunk_of(b, c))) << c;
  }
}

// Every pass at every SIMD level the CPU supports returns the bits of the scalar level, on a
// group of chunks whose last one is short, with unseen samples (undefined EMAs), samples seen
// in the closed epoch and before it, and zero weights.
TEST(RecomputePassesTest, EveryLevelMatchesScalar) {
  const uint64_t n = 3 * kSumChunk + 1234;  // One group: three full chunks and a short one.
  const std::vector<float> base = RandomWeights(n, 1, 0.1), current = RandomWeights(n, 2, 0.1);
  const std::vector<float> u = RandomWeights(n, 3, 0.0);
  // REDUCIBLE_LOSS's irreducible losses: around the EMAs, so that some signals are 0.
  const std::vector<float> irreducible = RandomWeights(n, 4, 0.3);
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(u[i] * 100) % 4;
    stats[i] = kind == 0 ? SampleLossStats{std::numeric_limits<float>::quiet_NaN(), 0, 0}
                         : SampleLossStats{u[i] * u[i], 1, static_cast<uint16_t>(kind)};
  }
  struct Run {
    std::vector<ChunkScan> scans = std::vector<ChunkScan>(kChunksPerGroup);
    std::vector<exact_sum::ChunkSum> sums;
    std::vector<float> out;
  };
  auto run = [&](SimdLevel level, LossWeightKind kind) {
    Run r;
    r.out.assign(n, 7.0f);
    const RecomputeArrays arrays{
        base.data(), current.data(), stats.data(), r.out.data(),
        kind == LossWeightKind::kReducibleLoss ? irreducible.data() : nullptr};
    RawWeightRule rule;
    rule.kind = kind;
    rule.mix = 0.25;
    rule.mean_f = 0.6;
    rule.eta = 3;
    rule.marker = 2;
    ScanChunks(level, arrays, rule, 0, n, r.scans.data());
    exact_sum::ChunkSum sums[kChunksPerGroup], base_factor_sums[kChunksPerGroup];
    if (kind != LossWeightKind::kMultiplicative) {
      LossFactorParams factors;
      factors.prior = 0.3;
      factors.epsilon = 1e-3;
      factors.alpha = 0.7;
      factors.x_max = 4.2;
      factors.log2_x_max = det::Log2(factors.x_max);
      LossFactorsChunks(level, arrays, rule, factors, 0, n, sums, base_factor_sums);
      r.sums.insert(r.sums.end(), sums, sums + kChunksPerGroup);
      r.sums.insert(r.sums.end(), base_factor_sums, base_factor_sums + kChunksPerGroup);
    }
    const ClampRule clamp{1.3, 0.2, 3};
    SumClampedChunks(level, arrays, rule, clamp, 0, n, sums);
    r.sums.insert(r.sums.end(), sums, sums + kChunksPerGroup);
    WriteWeightsRange(level, arrays, rule, clamp, 0.9, 0, n);
    return r;
  };
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative,
                              LossWeightKind::kReducibleLoss}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const Run want = run(SimdLevel::kScalar, kind);
    for (SimdLevel level : SupportedSimdLevels()) {
      const Run got = run(level, kind);
      const int l = static_cast<int>(level);
      for (uint64_t c = 0; c < kChunksPerGroup; ++c) {
        EXPECT_EQ(got.scans[c].first_bad, kNoSample) << l;
        EXPECT_EQ(got.scans[c].seen, want.scans[c].seen) << l;
        EXPECT_TRUE(Same(got.scans[c].ema_sum, want.scans[c].ema_sum)) << l;
        EXPECT_EQ(got.scans[c].ema_max, want.scans[c].ema_max) << l;
        EXPECT_TRUE(Same(got.scans[c].raw_sum, want.scans[c].raw_sum)) << l;
        EXPECT_TRUE(Same(got.scans[c].base_sum, want.scans[c].base_sum)) << l;
      }
      ASSERT_EQ(got.sums.size(), want.sums.size());
      for (size_t k = 0; k < got.sums.size(); ++k) {
        EXPECT_TRUE(Same(got.sums[k], want.sums[k])) << l << ", sum " << k;
      }
      EXPECT_EQ(std::memcmp(got.out.data(), want.out.data(), n * sizeof(float)), 0) << l;
    }
  }
}

// A bad entry stops its chunk's scan and is found at its index, in any lane of a group.
TEST(RecomputePassesTest, ScanFindsTheFirstBadEntryOfEachChunk) {
  const uint64_t n = 2 * kSumChunk + 100;
  std::vector<float> base(n, 1.0f), current(n, 1.0f);
  std::vector<SampleLossStats> stats(n, SampleLossStats{1.0f, 1, 1});
  base[kSumChunk + 700] = -1;                                                // Chunk 1.
  stats[kSumChunk + 900].ema_loss = std::numeric_limits<float>::infinity();  // Chunk 1, later.
  current[2 * kSumChunk + 99] = std::numeric_limits<float>::quiet_NaN();     // Chunk 2, last.
  stats[5] = {std::numeric_limits<float>::quiet_NaN(), 0, 0};  // Undefined EMA: not an error.
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<ChunkScan> scans(kChunksPerGroup);
    RawWeightRule rule;
    rule.kind = LossWeightKind::kLoss;
    ScanChunks(level, {base.data(), current.data(), stats.data(), nullptr}, rule, 0, n,
               scans.data());
    EXPECT_EQ(scans[0].first_bad, kNoSample);
    EXPECT_EQ(scans[0].seen, kSumChunk - 1);
    EXPECT_TRUE(scans[0].unseen);
    EXPECT_EQ(scans[1].first_bad, kSumChunk + 700);
    EXPECT_EQ(scans[2].first_bad, 2 * kSumChunk + 99);
  }
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
