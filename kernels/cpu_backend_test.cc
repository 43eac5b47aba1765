// Properties, statistics, golden hashes and sizes of the CPU backend's plans and weights.
#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/det_math.h"
#include "kernels/mixture/window.h"
#include "kernels/testing/backend_state.h"
#include "kernels/testing/mixture_cases.h"
#include "kernels/testing/policy_cases.h"
#include "kernels/testing/test_util.h"
#include "kernels/testing/weight_cases.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::ChiSquarePValue;
using testutil::Fnv1a;
using testutil::PlanIndices;
using testutil::PlanWith;
using testutil::RandomWeights;
using testutil::VariedStats;

// RecomputeWeights of host vectors (testutil::RecomputeWith) into `out`, which an error leaves
// as it was.
absl::Status Recompute(ComputeBackend& backend, const WeightPolicyParams& policy,
                       uint64_t closed_epoch, std::vector<float> base, std::vector<float> current,
                       const std::vector<SampleLossStats>& stats, std::vector<float>& out) {
  absl::StatusOr<std::vector<float>> next = testutil::RecomputeWith(
      backend, policy, closed_epoch, std::move(base), std::move(current), stats);
  if (!next.ok()) return next.status();
  out = *std::move(next);
  return absl::OkStatus();
}

TEST(ChiSquareTest, PValueOfKnownQuantiles) {
  // Textbook quantiles: chi2(0.95; 10) = 18.307, chi2(0.999; 100) = 149.449.
  EXPECT_NEAR(ChiSquarePValue(18.307, 10), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquarePValue(149.449, 100), 0.001, 1e-5);
}

struct Case {
  uint64_t n, m;
  bool replacement;
  bool weighted;
};

class PlanPropertiesTest : public ::testing::TestWithParam<Case> {};

TEST_P(PlanPropertiesTest, InvariantsHold) {
  const Case c = GetParam();
  auto backend = NewCpuBackend(4);
  for (uint64_t seed : {0ull, 1ull, 987654321ull}) {
    const std::vector<float> w = c.weighted ? RandomWeights(c.n, seed, 0.2) : std::vector<float>();
    uint64_t positive = c.n;
    if (c.weighted) positive = std::count_if(w.begin(), w.end(), [](float x) { return x > 0; });
    PlanSpec spec{c.n, c.m, seed, c.replacement, SampleOrder::kWeightedRandom};
    auto plan = PlanWith(*backend, spec, 3, w);
    if (positive == 0) {  // All weights zero: a bad input, whatever the mode.
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    if (!c.replacement && positive < c.m) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(testutil::PlanIndices(*plan).size(), c.m);
    for (uint64_t idx : testutil::PlanIndices(*plan)) {
      ASSERT_LT(idx, c.n);
      if (c.weighted) {
        ASSERT_GT(w[idx], 0.0f) << "zero-weight sample " << idx << " drawn";
      }
    }
    if (!c.replacement) {
      std::vector<uint64_t> sorted = testutil::PlanIndices(*plan);
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "repeat";
      if (c.m == c.n) {
        for (uint64_t i = 0; i < c.n; ++i) ASSERT_EQ(sorted[i], i);  // A permutation.
      }
    }
    // Same inputs, any thread count: the same plan.
    auto again = PlanWith(*NewCpuBackend(1), spec, 3, w);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(Fnv1a(testutil::PlanIndices(*again)), Fnv1a(testutil::PlanIndices(*plan)));
    // Another epoch: another plan (for plans with room to differ).
    if (c.n >= 8 && !(c.weighted == false && c.m == 1 && c.n < 8)) {
      auto next = PlanWith(*backend, spec, 4, w);
      ASSERT_TRUE(next.ok());
      EXPECT_NE(testutil::PlanIndices(*next), testutil::PlanIndices(*plan));
    }
    // Shards of every mode partition the plan's positions; their multiset union is the plan.
    for (uint32_t r : {1u, 3u, 8u}) {
      for (PartitionMode part : {PartitionMode::kInterleaved, PartitionMode::kContiguous}) {
        ShardSpec shard{r, part, UnevenMode::kUneven};
        std::vector<uint64_t> all;
        for (uint32_t rank = 0; rank < r; ++rank) {
          std::vector<uint64_t> s(*ShardLength(c.m, shard, rank));
          ASSERT_TRUE(backend->ExtractShard(*plan, shard, rank, 0, absl::MakeSpan(s)).ok());
          all.insert(all.end(), s.begin(), s.end());
        }
        std::vector<uint64_t> want = testutil::PlanIndices(*plan);
        std::sort(all.begin(), all.end());
        std::sort(want.begin(), want.end());
        EXPECT_EQ(all, want);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, PlanPropertiesTest,
    ::testing::Values(Case{1, 1, false, false}, Case{1, 1, true, true}, Case{2, 1, false, true},
                      Case{3, 3, false, false}, Case{7, 5, false, true}, Case{10, 10, false, true},
                      Case{10, 25, true, true}, Case{100, 100, false, false},
                      Case{1000, 300, false, true}, Case{1000, 1000, true, true},
                      Case{1000, 999, true, false}, Case{4097, 4000, false, false},
                      Case{100000, 100000, false, false}, Case{100000, 5000, false, true},
                      Case{100000, 250000, true, true}));

// Golden hashes: a change here means plans changed for users with the same (seed, epoch,
// weights). That breaks the determinism contract (and any CUDA backend that must agree): only
// update them deliberately, with a note in the commit.
TEST(PlanTest, GoldenHashes) {
  auto backend = NewCpuBackend(2);
  const std::vector<float> w = RandomWeights(10000, 5, 0.1);
  struct Golden {
    PlanSpec spec;
    bool weighted;
    uint64_t hash;
  } goldens[] = {
      {{10000, 10000, 42, false, SampleOrder::kWeightedRandom}, false, 0x962b6d1c0eb2cdabull},
      {{10000, 2500, 42, false, SampleOrder::kWeightedRandom}, true, 0x0c7f18011290bc28ull},
      {{10000, 10000, 42, true, SampleOrder::kWeightedRandom}, true, 0x0fe722eeef7cddbaull},
      {{10000, 7000, 42, true, SampleOrder::kWeightedRandom}, false, 0xa841d9c84ca8cc6cull},
  };
  for (const Golden& g : goldens) {
    auto plan = PlanWith(*backend, g.spec, 1, g.weighted ? w : std::vector<float>());
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(Fnv1a(testutil::PlanIndices(*plan)), g.hash)
        << std::hex << "0x" << Fnv1a(testutil::PlanIndices(*plan));
  }
}

// Plans without replacement of M <= 1024 have one shuffle bucket (b = 0) under every bucket
// rule the definition has had, so these hashes must survive a change of that rule.
TEST(PlanTest, GoldenHashesOfOneShuffleBucket) {
  auto backend = NewCpuBackend(2);
  const std::vector<float> w = RandomWeights(5000, 9, 0.1);
  struct Golden {
    PlanSpec spec;
    bool weighted;
    uint64_t hash;
  } goldens[] = {
      {{1000, 1000, 42, false, SampleOrder::kWeightedRandom}, false, 0x651b264d2784754bull},
      {{1024, 1024, 7, false, SampleOrder::kWeightedRandom}, false, 0xb321bf632bece5c7ull},
      {{5000, 1024, 42, false, SampleOrder::kWeightedRandom}, true, 0xc2c372ba9e3312f0ull},
      {{5000, 300, 3, false, SampleOrder::kWeightedRandom}, false, 0x223c414fc5263fd6ull},
  };
  for (const Golden& g : goldens) {
    const std::vector<float> weights(w.begin(), w.begin() + g.spec.num_samples);
    auto plan = PlanWith(*backend, g.spec, 1, g.weighted ? weights : std::vector<float>());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(Fnv1a(testutil::PlanIndices(*plan)), g.hash)
        << std::hex << "0x" << Fnv1a(testutil::PlanIndices(*plan));
  }
}

std::vector<SampleLossStats> Stats(const std::vector<float>& ema,
                                   const std::vector<uint32_t>& count,
                                   const std::vector<uint32_t>& last) {
  std::vector<SampleLossStats> stats(ema.size());
  for (size_t i = 0; i < ema.size(); ++i) {
    stats[i] = {ema[i], static_cast<uint16_t>(count[i]), static_cast<uint16_t>(last[i])};
  }
  return stats;
}

// Chi-square of observed counts against expected proportions `w`.
double PValue(const std::vector<uint64_t>& counts, const std::vector<float>& w, uint64_t total) {
  double sum_w = 0;
  for (float x : w) sum_w += x;
  double chi2 = 0;
  int dof = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0) {
      EXPECT_EQ(counts[i], 0u) << "zero-weight sample " << i;
      continue;
    }
    const double expected = total * w[i] / sum_w;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++dof;
  }
  return ChiSquarePValue(chi2, dof);
}

TEST(StatisticsTest, WithReplacementFrequenciesFollowWeights) {
  auto backend = NewCpuBackend(2);
  const uint64_t n = 200, m = 1'000'000;
  const std::vector<float> w = RandomWeights(n, 77, 0.1);
  auto plan = PlanWith(*backend, {n, m, 2024, true, SampleOrder::kWeightedRandom}, 0, w);
  ASSERT_TRUE(plan.ok());
  std::vector<uint64_t> counts(n, 0);
  for (uint64_t idx : testutil::PlanIndices(*plan)) ++counts[idx];
  const double p = PValue(counts, w, m);
  EXPECT_GT(p, 1e-3) << "chi-square p-value";
  // And the test has power: the same counts against uniform expectations fail.
  EXPECT_LT(PValue(counts, std::vector<float>(n, 1.0f), m), 1e-9);
}

TEST(StatisticsTest, WithoutReplacementFirstDrawFollowsWeights) {
  // With M = 1 the single selected sample is drawn with probability w_i / sum(w): over many
  // epochs the counts follow the weights.
  auto backend = NewCpuBackend(2);
  const uint64_t n = 50, epochs = 200'000;
  const std::vector<float> w = RandomWeights(n, 3, 0.1);
  const auto weights = testutil::WeightsOf(*backend, w);
  std::vector<uint64_t> counts(n, 0);
  for (uint64_t e = 0; e < epochs; ++e) {
    auto plan =
        backend->PlanEpoch({n, 1, 99, false, SampleOrder::kWeightedRandom}, e, weights.get());
    ASSERT_TRUE(plan.ok());
    ++counts[testutil::PlanIndices(*plan)[0]];
  }
  EXPECT_GT(PValue(counts, w, epochs), 1e-3);
}

TEST(StatisticsTest, WithoutReplacementSetsFollowSuccessiveSampling) {
  // M = 3 of N = 6: the selected set must have the probability of three successive weighted
  // draws without replacement (what Efraimidis-Spirakis selection is), summed over the 3! orders
  // of each of the 20 sets. Chi-square over the 20 sets, 120000 epochs.
  auto backend = NewCpuBackend(1);
  const std::vector<float> w = {0.5f, 1.0f, 1.5f, 2.0f, 4.0f, 8.0f};
  const uint64_t n = w.size(), m = 3, epochs = 120'000;
  double total = 0;
  for (float x : w) total += x;
  std::map<uint32_t, double> expected;  // Set bitmask -> probability.
  for (uint64_t a = 0; a < n; ++a) {
    for (uint64_t b = 0; b < n; ++b) {
      for (uint64_t c = 0; c < n; ++c) {
        if (a == b || a == c || b == c) continue;
        const double p = w[a] / total * w[b] / (total - w[a]) * w[c] / (total - w[a] - w[b]);
        expected[(1u << a) | (1u << b) | (1u << c)] += p;
      }
    }
  }
  ASSERT_EQ(expected.size(), 20u);
  const auto weights = testutil::WeightsOf(*backend, w);
  std::map<uint32_t, uint64_t> observed;
  for (uint64_t e = 0; e < epochs; ++e) {
    auto plan =
        backend->PlanEpoch({n, m, 31, false, SampleOrder::kWeightedRandom}, e, weights.get());
    ASSERT_TRUE(plan.ok());
    uint32_t set = 0;
    for (uint64_t idx : testutil::PlanIndices(*plan)) set |= 1u << idx;
    ++observed[set];
  }
  double chi2 = 0;
  for (const auto& [set, p] : expected) {
    const double want = p * epochs;
    chi2 += (observed[set] - want) * (observed[set] - want) / want;
  }
  EXPECT_EQ(observed.size(), 20u) << "a set outside the 20 of size 3";
  EXPECT_GT(ChiSquarePValue(chi2, 19), 1e-3) << "chi2 = " << chi2;
}

TEST(StatisticsTest, WithoutReplacementInclusionFavoursHeavySamples) {
  // M = N/2 of N with two weight classes (1 and 4): inclusion probability of heavy samples must
  // clearly exceed that of light ones, and every drawn sample exactly once per epoch.
  auto backend = NewCpuBackend(2);
  const uint64_t n = 10000, m = 5000;
  std::vector<float> w(n, 1.0f);
  for (uint64_t i = 0; i < n; i += 2) w[i] = 4.0f;
  const auto weights = testutil::WeightsOf(*backend, w);
  uint64_t heavy = 0, light = 0;
  for (uint64_t e = 0; e < 20; ++e) {
    auto plan =
        backend->PlanEpoch({n, m, 5, false, SampleOrder::kWeightedRandom}, e, weights.get());
    ASSERT_TRUE(plan.ok());
    for (uint64_t idx : testutil::PlanIndices(*plan)) (idx % 2 == 0 ? heavy : light)++;
  }
  // Exact ES inclusion for this setup: heavy ≈ 0.77, light ≈ 0.23 of the picks.
  const double heavy_share = static_cast<double>(heavy) / (heavy + light);
  EXPECT_GT(heavy_share, 0.70);
  EXPECT_LT(heavy_share, 0.85);
}

TEST(StatisticsTest, ShuffleIsUniformOverPositions) {
  // M = N = 8 without replacement: the sample at position 0 is uniform over the 8 samples.
  auto backend = NewCpuBackend(1);
  const uint64_t n = 8, epochs = 80'000;
  std::vector<uint64_t> first(n, 0);
  for (uint64_t e = 0; e < epochs; ++e) {
    auto plan = backend->PlanEpoch({n, n, 1, false, SampleOrder::kWeightedRandom}, e, {});
    ASSERT_TRUE(plan.ok());
    ++first[testutil::PlanIndices(*plan)[0]];
  }
  EXPECT_GT(PValue(first, std::vector<float>(n, 1.0f), epochs), 1e-3);
}

TEST(WeightsTest, LossPolicyMovesWeightByItsFormula) {
  auto backend = NewCpuBackend(2);
  // 4 samples: losses 0, 1, 3 and one never seen (prior = mean EMA = 4/3). alpha 1, eps 0.5,
  // mix 0, wide clamps: w ∝ loss + eps = 0.5, 1.5, 3.5, 1.8333.
  const std::vector<float> ema = {0, 1, 3, 0};
  const std::vector<uint32_t> count = {1, 1, 1, 0};
  const std::vector<uint32_t> last = {1, 1, 1, 0};
  const std::vector<float> current(4, 1.0f);
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  p.epsilon = 0.5;
  p.clamp_lo = 0.01;
  p.clamp_hi = 100;
  std::vector<float> out(4);
  ASSERT_TRUE(Recompute(*backend, p, 0, {}, current, Stats(ema, count, last), out).ok());
  const double f[] = {0.5, 1.5, 3.5, 4.0 / 3 + 0.5};
  const double mean = (f[0] + f[1] + f[2] + f[3]) / 4;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], f[i] / mean, 1e-6) << i;

  // alpha 2, mix 0.5, base weights (2, 1, 1, 1) and a clamp at 1.5 x mean.
  p.alpha = 2;
  p.mix = 0.5;
  p.clamp_hi = 1.5;
  const std::vector<float> base = {2, 1, 1, 1};
  ASSERT_TRUE(Recompute(*backend, p, 0, base, current, Stats(ema, count, last), out).ok());
  double g[4], gm = 0;
  for (int i = 0; i < 4; ++i) gm += f[i] * f[i] / 4;
  double w[4], wm = 0;
  for (int i = 0; i < 4; ++i) {
    g[i] = 0.5 * f[i] * f[i] / gm + 0.5;
    w[i] = base[i] * g[i];
    wm += w[i] / 4;
  }
  double c[4], cm = 0;
  for (int i = 0; i < 4; ++i) {
    c[i] = std::clamp(w[i] / wm, 0.01, 1.5);
    cm += c[i] / 4;
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], c[i] / cm, 1e-6) << i;
  // The high-loss sample gained weight relative to the low-loss one.
  EXPECT_GT(out[2], out[1]);
  EXPECT_GT(out[1], out[0] / 2);
}

TEST(WeightsTest, ReducibleLossByHand) {
  // 4 samples: EMAs 3, 1, 2.5 and one never seen; irreducible losses 1, 2, 0.5, 9. The
  // reducible losses of the seen: max(3 - 1, 0) = 2, max(1 - 2, 0) = 0, max(2.5 - 0.5, 0) = 2;
  // the unseen sample takes the configured prior 1 (its irreducible loss is not read). eps 0.5:
  // x = 2.5, 0.5, 2.5, 1.5; alpha 1: f = x / 2.5 = 1, 0.2, 1, 0.6; mean_f = 0.7; mix 0, wide
  // clamps: w = f / mean_f = 10/7, 2/7, 10/7, 6/7.
  const std::vector<float> ema = {3, 1, 2.5f, 0};
  const std::vector<uint32_t> count = {2, 1, 3, 0};
  const std::vector<uint32_t> last = {1, 1, 1, 0};
  const std::vector<float> irreducible = {1, 2, 0.5f, 9};
  WeightPolicyParams p;
  p.loss = LossWeightKind::kReducibleLoss;
  p.epsilon = 0.5;
  p.prior_loss = 1.0;
  p.clamp_lo = 0.01;
  p.clamp_hi = 100;
  std::vector<float> out(4);
  ASSERT_TRUE(RecomputeWeightsOnHost(2, p, 0, {}, {}, Stats(ema, count, last), absl::MakeSpan(out),
                                     irreducible)
                  .ok());
  const double want[] = {10.0 / 7, 2.0 / 7, 10.0 / 7, 6.0 / 7};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], want[i]) << i;

  // Without a configured prior the unseen sample takes the mean reducible loss of the seen:
  // (2 + 0 + 2) / 3 = 4/3, x = 11/6; f = 1, 0.2, 1, 11/15.
  p.prior_loss.reset();
  ASSERT_TRUE(RecomputeWeightsOnHost(2, p, 0, {}, {}, Stats(ema, count, last), absl::MakeSpan(out),
                                     irreducible)
                  .ok());
  const double f[] = {1, 0.2, 1, 11.0 / 15};
  const double mean_f = (f[0] + f[1] + f[2] + f[3]) / 4;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], f[i] / mean_f, 1e-6) << i;

  // REDUCIBLE_LOSS needs the N irreducible losses, finite and >= 0.
  absl::Status s = RecomputeWeightsOnHost(2, p, 0, {}, {}, Stats(ema, count, last),
                                          absl::MakeSpan(out), {});
  EXPECT_EQ(s.message(), "irreducible_losses: missing; policy.loss = REDUCIBLE_LOSS needs them");
  const std::vector<float> bad = {1, -1, 0, 0};
  s = RecomputeWeightsOnHost(2, p, 0, {}, {}, Stats(ema, count, last), absl::MakeSpan(out), bad);
  EXPECT_EQ(s.message(), "irreducible_losses[1] = -1: must be finite and >= 0");
}

TEST(WeightsTest, MultiplicativeOnlyTouchesSamplesSeenInTheEpoch) {
  auto backend = NewCpuBackend(2);
  const std::vector<float> ema = {1, 1, 0, 0};
  const std::vector<uint32_t> count = {1, 1, 1, 0};
  const std::vector<uint32_t> last = {EpochMarker(2), EpochMarker(1), EpochMarker(2), 0};
  const std::vector<float> current = {1, 1, 1, 1};
  WeightPolicyParams p;
  p.loss = LossWeightKind::kMultiplicative;
  p.eta = 1.0;
  std::vector<float> out(4);
  ASSERT_TRUE(Recompute(*backend, p, 2, {}, current, Stats(ema, count, last), out).ok());
  // Raw: 2, 1, 1, 1 -> mean 1.25.
  EXPECT_NEAR(out[0], 2 / 1.25, 1e-6);
  EXPECT_NEAR(out[1], 1 / 1.25, 1e-6);
  EXPECT_NEAR(out[3], 1 / 1.25, 1e-6);
}

TEST(WeightsTest, ZeroBaseWeightsStayZeroThroughClamps) {
  auto backend = NewCpuBackend(2);
  const std::vector<float> base = {0, 1, 1, 1};
  const std::vector<float> current = base;
  const auto stats = Stats({0, 0.1f, 5, 9}, {1, 1, 1, 1}, {1, 1, 1, 1});
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
    WeightPolicyParams p;
    p.loss = kind;
    p.clamp_lo = 0.5;
    std::vector<float> out(4);
    ASSERT_TRUE(Recompute(*backend, p, 0, base, current, stats, out).ok());
    EXPECT_EQ(out[0], 0.0f) << "a zero-weight sample would be drawn";
    EXPECT_GT(out[1], 0.0f);
  }
}

TEST(WeightsTest, HugeLossesDoNotOverflow) {
  // (3e38 + eps)^8 and w (1 + 100 * 3e38) pass even the double range: the results must still be
  // finite, positive weights of mean 1 that favour the high-loss samples.
  auto backend = NewCpuBackend(2);
  const auto stats = Stats({3e38f, 1.0f, 0.5f, 1e20f}, {1, 1, 1, 1}, {1, 1, 1, 1});
  const std::vector<float> current(4, 1.0f);
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
    WeightPolicyParams p;
    p.loss = kind;
    p.alpha = 8;
    p.eta = 100;
    std::vector<float> out(4);
    ASSERT_TRUE(Recompute(*backend, p, 0, {}, current, stats, out).ok());
    double sum = 0;
    for (float w : out) {
      ASSERT_TRUE(std::isfinite(w));
      ASSERT_GT(w, 0.0f);
      sum += w;
    }
    EXPECT_NEAR(sum / 4, 1.0, 1e-6);
    EXPECT_GT(out[0], out[1]);
    // Sample 0 holds almost all the raw weight: 4 times the mean (N = 4, below clamp_hi); the
    // others' factors vanish (underflow) against it, and the clamp lifts them to clamp_lo.
    EXPECT_NEAR(out[1] / out[0], p.clamp_lo / 4, 1e-6);
    EXPECT_EQ(out[1], out[2]);
    EXPECT_EQ(out[1], out[3]);
  }
}

TEST(WeightsTest, AllFactorsVanishingLeavesEqualWeights) {
  // The only sample with a non-negligible factor has base weight 0: every raw weight is 0 (the
  // other factor underflows), and the samples the base allows must still get valid weights.
  auto backend = NewCpuBackend(2);
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  p.alpha = 8;
  std::vector<float> out(3);
  ASSERT_TRUE(Recompute(*backend, p, 0, std::vector<float>{0, 1, 1}, std::vector<float>(3, 1),
                        Stats({1e30f, 0, 0}, {1, 1, 1}, {1, 1, 1}), out)
                  .ok());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], 1.5f);  // Mean 1 over the three samples.
  EXPECT_FLOAT_EQ(out[2], 1.5f);
}

TEST(WeightsTest, AllZeroWeightsAreRejected) {
  auto backend = NewCpuBackend(2);
  const auto stats = Stats({1, 1}, {1, 1}, {1, 1});
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  std::vector<float> out = {7, 7};
  // On host arrays (weights made by the backend cannot be all 0: MakeWeights refuses them).
  absl::Status s = RecomputeWeightsOnHost(2, p, 0, std::vector<float>{0, 0},
                                          std::vector<float>{1, 1}, stats, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("base: all 2 weights are 0"));
  p.loss = LossWeightKind::kMultiplicative;
  s = RecomputeWeightsOnHost(2, p, 0, {}, std::vector<float>{0, 0}, stats, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("current: all 2 weights are 0"));
  EXPECT_EQ(out, (std::vector<float>{7, 7}));
  // Through the backend's objects, all-zero weights are refused when they are made.
  s = backend->MakeWeights({0, 0}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights: all 2 weights are 0"));
}

TEST(WeightsTest, BadInputsNameFieldAndValueAndChangeNothing) {
  auto backend = NewCpuBackend(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto good_stats = Stats({1, 1, 1}, {1, 1, 1}, {1, 1, 1});
  const std::vector<float> ones(3, 1.0f);
  struct Case {
    std::vector<float> base, current;
    std::vector<SampleLossStats> stats;
    size_t out_size;
    std::string want;
  } cases[] = {
      {{}, ones, good_stats, 0, "num_samples = 0"},
      {{1, 1}, ones, good_stats, 3, "base: 2 values for num_samples 3"},
      {{}, {1, 1}, good_stats, 3, "current: 2 values for num_samples 3"},
      {{}, ones, Stats({1}, {1}, {1}), 3, "stats: 1 values for num_samples 3"},
      {{1, -2, 1}, ones, good_stats, 3, "base[1] = -2"},
      {{}, {1, 1, INFINITY}, good_stats, 3, "current[2] = inf"},
      {{}, ones, Stats({1, 1, -1}, {1, 1, 1}, {1, 1, 1}), 3, "stats[2].ema_loss = -1"},
      {{}, ones, Stats({nan, 1, 1}, {0, 1, 1}, {4, 1, 1}), 3, "stats[0].ema_loss = nan"},
  };
  for (const Case& c : cases) {
    for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
      WeightPolicyParams p;
      p.loss = kind;
      std::vector<float> out(c.out_size, 7.0f);
      absl::Status s =
          RecomputeWeightsOnHost(2, p, 0, c.base, c.current, c.stats, absl::MakeSpan(out));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
      EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
      EXPECT_EQ(out, std::vector<float>(c.out_size, 7.0f)) << c.want;
    }
  }
  // The first bad index is named whatever the thread count (1e6 samples: many chunks).
  std::vector<float> big(1'000'000, 1.0f);
  big[700'000] = -1;
  big[900'000] = nan;
  std::vector<SampleLossStats> stats(big.size());
  std::vector<float> out(big.size());
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  for (int threads : {1, 4}) {
    absl::Status s = RecomputeWeightsOnHost(threads, p, 0, big, big, stats, absl::MakeSpan(out));
    EXPECT_THAT(std::string(s.message()), HasSubstr("base[700000] = -1"));
  }
  // Through the backend's objects: bad weights are refused when made (naming the first, see
  // StateTest.MakeWeightsNamesTheFirstBadWeight), bad statistics by the recompute.
  for (const Case& c : cases) {
    if (c.out_size == 0 || c.stats.size() != c.out_size || c.base.size() == 2 ||
        c.current.size() == 2) {
      continue;  // Sizes: see StateTest.RecomputeNamesTheFirstSizeThatDiffers.
    }
    for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
      WeightPolicyParams p;
      p.loss = kind;
      std::vector<float> out(c.out_size, 7.0f);
      const absl::Status s = Recompute(*backend, p, 0, c.base, c.current, c.stats, out);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
      const std::string want =
          c.want.rfind("stats", 0) == 0 ? c.want : "weights" + c.want.substr(c.want.find('['));
      EXPECT_THAT(std::string(s.message()), HasSubstr(want));
    }
  }
}

TEST(WeightsTest, RecomputeDoesNotDependOnThreads) {
  const uint64_t n = 300'000;
  std::vector<SampleLossStats> stats(n);
  const std::vector<float> ema = RandomWeights(n, 4, 0.0), base = RandomWeights(n, 6, 0.1);
  for (uint64_t i = 0; i < n; ++i) {
    if (i % 3 != 0) stats[i] = {ema[i], 1, static_cast<uint16_t>(i % 2 ? EpochMarker(5) : 0)};
  }
  for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
    WeightPolicyParams p;
    p.loss = kind;
    p.alpha = 0.7;
    p.mix = 0.1;
    std::vector<float> a(n), b(n);
    ASSERT_TRUE(Recompute(*NewCpuBackend(1), p, 5, base, base, stats, a).ok());
    ASSERT_TRUE(Recompute(*NewCpuBackend(4), p, 5, base, base, stats, b).ok());
    EXPECT_EQ(a, b);
  }
}

// Golden hashes of RecomputeWeights: like the plans' (PlanTest.GoldenHashes), a change here
// changes every later epoch's weights and plans for users with the same losses, and breaks the
// agreement with other backends. Each case runs on 1, 2 and 3 threads.
TEST(WeightsTest, GoldenHashes) {
  // The table is shared with the CUDA backend's test (kernels/testing/weight_cases.h).
  for (const testutil::RecomputeGolden& g : testutil::RecomputeGoldens()) {
    const WeightPolicyParams p = testutil::GoldenPolicy(g);
    const std::vector<float> base =
        g.with_base ? RandomWeights(g.n, 11, 0.05) : std::vector<float>();
    std::vector<float> current = RandomWeights(g.n, 12, 0.05);
    current[0] = 1.0f;  // At least one positive.
    const std::vector<SampleLossStats> stats = VariedStats(g.n, 13);
    for (int threads : {1, 2, 3}) {
      std::vector<float> out(g.n, 7.0f);
      ASSERT_TRUE(Recompute(*NewCpuBackend(threads), p, 5, base, current, stats, out).ok())
          << g.name;
      EXPECT_EQ(Fnv1a(out), g.hash)
          << g.name << ", " << threads << " threads: 0x" << std::hex << Fnv1a(out);
      // Not a hash of something degenerate: finite weights >= 0 (of mean 1 with a loss policy).
      double sum = 0;
      for (float w : out) {
        ASSERT_TRUE(std::isfinite(w) && w >= 0) << g.name << ": " << w;
        sum += w;
      }
      if (p.loss != LossWeightKind::kNone) {
        EXPECT_NEAR(sum / g.n, 1.0, 1e-4) << g.name;
      }
    }
  }
}

// The exact sum of docs/SAMPLING.md ("Exact sums") of f(0), ..., f(n-1), written with the C
// library (frexp, ldexp, floor, the compiler's 128-bit conversion) rather than exact_sum.h's bit
// manipulation: chunks of 4096 terms, each quantised to an integer below 2^63 at its chunk's
// exponent, the chunks' integer sums brought to the largest exponent, rounded once.
template <typename Term>
double ReferenceExactSum(uint64_t n, const Term& f) {
  auto eb = [](double v) {
    int e = 0;
    if (v != 0) std::frexp(v, &e);
    return std::max(1, e + 1022);
  };
  std::vector<std::pair<int, unsigned __int128>> chunks;
  for (uint64_t b = 0; b < n; b += 4096) {
    const uint64_t e = std::min(n, b + 4096);
    int exponent = 1;
    for (uint64_t i = b; i < e; ++i) exponent = std::max(exponent, eb(f(i)));
    unsigned __int128 sum = 0;
    for (uint64_t i = b; i < e; ++i) {
      sum += static_cast<uint64_t>(std::floor(std::ldexp(f(i), 1085 - exponent)));
    }
    chunks.emplace_back(exponent, sum);
  }
  int top = 1;
  for (const auto& [exponent, sum] : chunks) top = std::max(top, exponent);
  unsigned __int128 total = 0;
  for (const auto& [exponent, sum] : chunks) {
    total += top - exponent < 128 ? sum >> (top - exponent) : 0;
  }
  return std::ldexp(static_cast<double>(total), top - 1085);
}

// RecomputeWeights by its definition (docs/SAMPLING.md), one sample at a time: the executable
// specification the optimised backend (and any other backend) must match bit for bit. Every sum
// is the exact sum above.
std::vector<float> ReferenceRecompute(const WeightPolicyParams& p, uint64_t closed_epoch,
                                      const std::vector<float>& base,
                                      const std::vector<float>& current,
                                      const std::vector<SampleLossStats>& stats) {
  const uint64_t n = stats.size();
  auto chunked_sum = [n](const auto& f) { return ReferenceExactSum(n, f); };
  auto base_at = [&](uint64_t i) { return base.empty() ? 1.0 : double{base[i]}; };
  auto current_at = [&](uint64_t i) { return current.empty() ? 1.0 : double{current[i]}; };
  std::vector<float> out(n);
  if (p.loss == LossWeightKind::kNone) {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(base_at(i));
    return out;
  }
  std::function<double(uint64_t)> raw;
  std::function<bool(uint64_t)> excluded;
  std::vector<float> f(n);
  double mean = 0;  // Of the raw weights.
  if (p.loss == LossWeightKind::kLoss) {
    auto seen = [&](uint64_t i) { return stats[i].count > 0; };
    uint64_t seen_count = 0;
    double ema_max = 0;
    for (uint64_t i = 0; i < n; ++i) {
      if (seen(i)) ++seen_count, ema_max = std::max(ema_max, double{stats[i].ema_loss});
    }
    const double ema_sum =
        chunked_sum([&](uint64_t i) { return seen(i) ? double{stats[i].ema_loss} : 0.0; });
    const double prior = p.prior_loss.has_value() ? *p.prior_loss
                         : seen_count > 0         ? ema_sum / static_cast<double>(seen_count)
                                                  : 0.0;
    const double x_max =
        std::max(ema_max, seen_count < n ? prior : 0.0) + p.epsilon;  // ema_max = 0 if none seen
    for (uint64_t i = 0; i < n; ++i) {
      const double x = (seen(i) ? double{stats[i].ema_loss} : prior) + p.epsilon;
      f[i] = static_cast<float>(
          p.alpha == 1.0 ? x / x_max : det::Exp2(p.alpha * (det::Log2(x) - det::Log2(x_max))));
    }
    const double mean_f =
        chunked_sum([&](uint64_t i) { return double{f[i]}; }) / static_cast<double>(n);
    raw = [&, mean_f](uint64_t i) { return base_at(i) * ((1.0 - p.mix) * f[i] / mean_f + p.mix); };
    excluded = [&](uint64_t i) { return !base.empty() && base[i] == 0; };
    // The mean raw weight in closed form: (1 - mix) mean(base f) / mean_f + mix mean(base).
    const double mean_bf =
        chunked_sum([&](uint64_t i) { return base_at(i) * double{f[i]}; }) / static_cast<double>(n);
    const double mean_b = base.empty() ? 1.0 : chunked_sum(base_at) / static_cast<double>(n);
    mean = (1.0 - p.mix) * mean_bf / mean_f + p.mix * mean_b;
  } else {
    raw = [&](uint64_t i) {
      return stats[i].last_epoch == EpochMarker(closed_epoch)
                 ? current_at(i) * (1.0 + p.eta * stats[i].ema_loss)
                 : current_at(i);
    };
    excluded = [&](uint64_t i) { return !current.empty() && current[i] == 0; };
    mean = chunked_sum(raw) / static_cast<double>(n);
  }
  auto clamped = [&](uint64_t i) {
    return excluded(i) ? 0.0 : std::clamp(mean > 0 ? raw(i) / mean : 1.0, p.clamp_lo, p.clamp_hi);
  };
  const double mean2 = chunked_sum(clamped) / static_cast<double>(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(clamped(i) / mean2);
  return out;
}

TEST(WeightsTest, RecomputeMatchesItsDefinitionBitForBit) {
  // Random policies, sizes around the chunk and vector boundaries, and inputs of every kind.
  uint64_t s = 99;
  auto next = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0;  // [0, 1)
  };
  const uint64_t sizes[] = {1, 2, 513, 4'095, 4'097, 65'536, 65'537, 140'001};
  int compared = 0;
  for (int round = 0; round < 40; ++round) {
    const uint64_t n = sizes[round % 8];
    const WeightPolicyParams p = testutil::RandomLossPolicy(round, next);
    const std::vector<float> base =
        round % 2 ? RandomWeights(n, round, 0.1 * next()) : std::vector<float>();
    std::vector<float> current =
        round % 4 == 1 ? std::vector<float>() : RandomWeights(n, round + 100, 0.1 * next());
    if (!current.empty()) current[n / 2] = 2.0f;
    const std::vector<float> with_ones = current.empty() ? std::vector<float>(n, 1.0f) : current;
    std::vector<SampleLossStats> stats = VariedStats(n, round + 200);
    if (round % 8 == 5) stats.assign(n, SampleLossStats{});  // Nothing seen yet.
    const std::vector<float> want = ReferenceRecompute(p, 5, base, current, stats);
    for (int threads : {1, 2}) {
      // An empty `current` means all ones: the same result as ones passed explicitly.
      const std::vector<float>* currents[] = {&current, &with_ones};
      for (const std::vector<float>* c : currents) {
        std::vector<float> got(n, 7.0f);
        ASSERT_TRUE(Recompute(*NewCpuBackend(threads), p, 5, base, *c, stats, got).ok()) << round;
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << "round " << round << ", n " << n << ", " << threads << " threads, "
            << (c->empty() ? "no current weights" : "current weights");
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 160);
}

TEST(WeightsTest, BadStatisticsChangeNothing) {
  auto backend = NewCpuBackend(2);
  const std::vector<float> ema = {1, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<uint32_t> count = {1, 1};
  const std::vector<uint32_t> last = {1, 1};
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  std::vector<float> out = {7, 7};
  absl::Status s =
      Recompute(*backend, p, 0, {}, std::vector<float>{1, 1}, Stats(ema, count, last), out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("stats[1].ema_loss = nan"));
  EXPECT_EQ(out, (std::vector<float>{7, 7}));
}

// A weight of -0 is a zero weight (weights are validated by their IEEE bits, -0 allowed): it is
// never drawn, and the plan is the one with +0. Regression: the quantisation took the largest
// weight by its raw bits, where -0 (0x80000000) beat every positive weight, and drew garbage.
TEST(PlanTest, NegativeZeroWeightsAreZeroWeights) {
  auto backend = NewCpuBackend(2);
  std::vector<float> plus = RandomWeights(1000, 21, 0.2), minus = plus;
  for (float& w : minus) w = w == 0 ? -0.0f : w;
  for (bool replacement : {true, false}) {
    const PlanSpec spec{1000, replacement ? 1000u : 500u, 3, replacement};
    absl::StatusOr<Plan> a = PlanWith(*backend, spec, 2, plus);
    absl::StatusOr<Plan> b = PlanWith(*backend, spec, 2, minus);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(PlanIndices(*a), PlanIndices(*b)) << "replacement " << replacement;
    for (uint64_t i : PlanIndices(*b)) ASSERT_GT(plus[i], 0.0f) << "index " << i << " drawn";
  }
}

TEST(PlanTest, BadInputsNameFieldAndValue) {
  auto backend = NewCpuBackend(2);
  struct Bad {
    PlanSpec spec;
    std::vector<float> w;
    absl::StatusCode code;
    std::string want;
  } cases[] = {
      {{0, 1, 0, false}, {}, absl::StatusCode::kInvalidArgument, "num_samples = 0"},
      {{5, 0, 0, false}, {}, absl::StatusCode::kInvalidArgument, "samples_per_epoch = 0"},
      {{5, 6, 0, false}, {}, absl::StatusCode::kInvalidArgument, "samples_per_epoch = 6"},
      {{5, 5, 0, false}, {1, 1}, absl::StatusCode::kInvalidArgument, "weights: 2 values"},
      {{2, 2, 0, true}, {1, NAN}, absl::StatusCode::kInvalidArgument, "weights[1] = nan"},
      {{2, 2, 0, true}, {0, 0}, absl::StatusCode::kInvalidArgument, "all 2 weights are 0"},
      {{3, 3, 0, false}, {1, 0, 1}, absl::StatusCode::kFailedPrecondition, "2 have one"},
      {{3, 2, 0, false, SampleOrder::kSequential},
       {},
       absl::StatusCode::kInvalidArgument,
       "SEQUENTIAL"},
      // The shuffle's limit, M <= 2^34 without replacement (checked before anything is
      // allocated: these would need 128 GiB).
      {{(uint64_t{1} << 34) + 1, (uint64_t{1} << 34) + 1, 0, false},
       {},
       absl::StatusCode::kInvalidArgument,
       "samples_per_epoch = 17179869185 without replacement: must be <= 17179869184"},
      {{uint64_t{1} << 40, (uint64_t{1} << 34) + 1, 0, false},
       {},
       absl::StatusCode::kInvalidArgument,
       "samples_per_epoch = 17179869185 without replacement"},
  };
  for (const Bad& c : cases) {
    auto plan = PlanWith(*backend, c.spec, 0, c.w);
    EXPECT_EQ(plan.status().code(), c.code) << c.want;
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want));
  }
  auto plan = backend->PlanEpoch({10, 10, 0, false}, 0, {});
  ASSERT_TRUE(plan.ok());
  std::vector<uint64_t> out(3, 99);
  absl::Status s = backend->ExtractShard(*plan, ShardSpec{2}, 2, 0, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank = 2"));
  s = backend->ExtractShard(*plan, ShardSpec{2}, 0, 4, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<uint64_t>(3, 99));
}

TEST(PlanTest, WeightValidationMatchesValidateWeights) {
  // PlanEpoch checks the weights on their bits (vectorised): every class of float must get the
  // verdict of ValidateWeights, and -0 and subnormals count as zero and positive.
  auto backend = NewCpuBackend(2);
  auto from_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  };
  const float specials[] = {0.0f,
                            -0.0f,
                            from_bits(1),           // Smallest subnormal.
                            from_bits(0x7f7fffff),  // Largest finite.
                            INFINITY,
                            -INFINITY,
                            from_bits(0x7fc00000),  // NaN.
                            from_bits(0xffc00000),  // NaN with the sign bit.
                            -1e-45f,
                            -1.0f};
  for (float special : specials) {
    std::vector<float> w(70'000, 1.0f);  // Several validation chunks.
    w[65'600] = special;
    const absl::Status want = ValidateWeights(w);
    auto plan = PlanWith(*backend, {w.size(), w.size(), 1, true}, 0, w);
    EXPECT_EQ(plan.status().code(), want.code()) << special;
    EXPECT_EQ(plan.status().message(), want.message()) << special;
    if (plan.ok()) {
      for (uint64_t idx : testutil::PlanIndices(*plan)) ASSERT_GT(w[idx], 0.0f) << special;
      // Without replacement: M = N needs N positive weights; zeros (either sign) are not.
      auto all = PlanWith(*backend, {w.size(), w.size(), 1, false}, 0, w);
      EXPECT_EQ(all.status().code(),
                special > 0 ? absl::StatusCode::kOk : absl::StatusCode::kFailedPrecondition)
          << special;
    }
  }
}

TEST(SizesTest, TenMillionSamplePlans) {
  auto backend = NewCpuBackend(0);
  const uint64_t n = 10'000'000;
  auto plan = backend->PlanEpoch({n, n, 8, false, SampleOrder::kWeightedRandom}, 0, {});
  ASSERT_TRUE(plan.ok());
  std::vector<bool> seen(n, false);
  for (uint64_t idx : testutil::PlanIndices(*plan)) {
    ASSERT_FALSE(seen[idx]);
    seen[idx] = true;
  }
  const std::vector<float> w = RandomWeights(n, 8, 0.0);
  auto with = PlanWith(*backend, {n, n, 8, true, SampleOrder::kWeightedRandom}, 0, w);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(testutil::PlanIndices(*with).size(), n);
}

// ---- The backend's state objects (compute_backend.h) -------------------------------------------

// Objects of another backend: the CPU backend must refuse them, never read them.
class ForeignWeights final : public BackendWeights {
 public:
  uint64_t size() const override { return 3; }
  const WeightSummary& summary() const override { return summary_; }
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> ToHost() const override {
    return std::make_shared<const std::vector<float>>(3, 1.0f);
  }

 private:
  WeightSummary summary_;
};

class ForeignLossStats final : public BackendLossStats {
 public:
  uint64_t size() const override { return 3; }
  absl::StatusOr<uint64_t> Apply(uint64_t, absl::Span<const uint64_t>,
                                 absl::Span<const float>) override {
    return 0;
  }
  uint64_t SamplesSeen() const override { return 0; }
  absl::StatusOr<std::vector<SampleLossStats>> ToHost() const override {
    return std::vector<SampleLossStats>(3);
  }
  absl::Status Restore(absl::Span<const SampleLossStats>) override { return absl::OkStatus(); }
};

std::vector<SampleLossStats> HostStats(const BackendLossStats& stats) {
  absl::StatusOr<std::vector<SampleLossStats>> host = stats.ToHost();
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *std::move(host) : std::vector<SampleLossStats>();
}

bool SameStats(const std::vector<SampleLossStats>& a, const std::vector<SampleLossStats>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(SampleLossStats)) == 0;
}

TEST(StateTest, MakeWeightsKeepsTheVectorAndItsSummary) {
  for (int threads : {1, 3}) {
    auto backend = NewCpuBackend(threads);
    // Several summary chunks (4096) and groups, and a partial last chunk.
    std::vector<float> w = RandomWeights(200'003, 21, 0.1);
    const std::vector<float> copy = w;
    const float* data = w.data();
    absl::StatusOr<std::shared_ptr<const BackendWeights>> made = backend->MakeWeights(std::move(w));
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ((*made)->size(), copy.size());
    // ToHost hands out the vector it was made from: no copy.
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> host = (*made)->ToHost();
    ASSERT_TRUE(host.ok());
    EXPECT_EQ((*host)->data(), data);
    EXPECT_EQ(**host, copy);
    // The summary, computed in parallel, has the bits of SummarizeWeights.
    const WeightSummary want = SummarizeWeights(copy), got = (*made)->summary();
    EXPECT_EQ(std::memcmp(&got.min, &want.min, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&got.max, &want.max, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&got.mean, &want.mean, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&got.effective_sample_size, &want.effective_sample_size, sizeof(double)),
              0);
    EXPECT_EQ(got.zero_count, want.zero_count);
    EXPECT_GT(got.zero_count, 0u);
  }
}

TEST(StateTest, MakeWeightsNamesTheFirstBadWeight) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Bad {
    std::vector<float> w;
    std::string want;
  } cases[] = {
      {{}, "weights: empty"},
      {{1, nan, 1}, "weights[1] = nan: weights must be finite and >= 0"},
      {{1, 1, -2}, "weights[2] = -2: weights must be finite and >= 0"},
      {{INFINITY}, "weights[0] = inf"},
      {{0, -0.0f, 0}, "weights: all 3 weights are 0"},
  };
  for (const Bad& c : cases) {
    absl::Status s = NewCpuBackend(2)->MakeWeights(c.w).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
  }
  // The first bad one, whatever the thread count (validated in parallel chunks).
  std::vector<float> w(300'000, 1.0f);
  w[200'001] = -1;
  w[250'000] = nan;
  for (int threads : {1, 4}) {
    absl::Status s = NewCpuBackend(threads)->MakeWeights(w).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr("weights[200001] = -1")) << threads;
  }
}

TEST(StateTest, RecomputeNamesTheFirstSizeThatDiffers) {
  auto backend = NewCpuBackend(2);
  const auto three = testutil::WeightsOf(*backend, {1, 2, 3});
  const auto two = testutil::WeightsOf(*backend, {1, 2});
  auto stats3 = testutil::LossStatsOf(*backend, std::vector<SampleLossStats>(3));
  auto stats4 = testutil::LossStatsOf(*backend, std::vector<SampleLossStats>(4));
  ASSERT_TRUE(stats3.ok() && stats4.ok());
  struct Bad {
    const BackendWeights *base, *current;
    const BackendLossStats* stats;
    std::string want;
  } cases[] = {
      {three.get(), two.get(), stats3->get(), "current: 2 values, but base has 3"},
      {three.get(), three.get(), stats4->get(), "stats: 4 values, but base has 3"},
      {nullptr, two.get(), stats3->get(), "stats: 3 values, but current has 2"},
      {nullptr, nullptr, nullptr, "stats: missing"},
  };
  for (const Bad& c : cases) {
    for (LossWeightKind kind : {LossWeightKind::kLoss, LossWeightKind::kMultiplicative}) {
      WeightPolicyParams p;
      p.loss = kind;
      absl::Status s = backend->RecomputeWeights(p, 0, c.base, c.current, c.stats).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
      EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
    }
  }
  // A bad policy is named before anything else.
  WeightPolicyParams p;
  p.loss = LossWeightKind::kLoss;
  p.alpha = -1;
  absl::Status s = backend->RecomputeWeights(p, 0, three.get(), two.get(), nullptr).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("policy.alpha = -1"));
}

TEST(StateTest, WithoutALossPolicyTheNextWeightsAreTheBaseItself) {
  auto backend = NewCpuBackend(2);
  const auto base = testutil::WeightsOf(*backend, {1, 2, 3});
  const auto current = testutil::WeightsOf(*backend, {3, 2, 1});
  WeightPolicyParams p;
  absl::StatusOr<std::shared_ptr<const BackendWeights>> next =
      backend->RecomputeWeights(p, 0, base.get(), current.get(), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->get(), base.get());
  next = backend->RecomputeWeights(p, 0, nullptr, current.get(), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->get(), nullptr);  // Uniform.
}

TEST(StateTest, ObjectsOfAnotherBackendAreRefused) {
  auto backend = NewCpuBackend(2);
  const ForeignWeights foreign;
  ForeignLossStats foreign_stats;
  const auto own = testutil::WeightsOf(*backend, {1, 2, 3});
  auto own_stats = testutil::LossStatsOf(*backend, std::vector<SampleLossStats>(3));
  ASSERT_TRUE(own_stats.ok());
  WeightPolicyParams p;
  p.loss = LossWeightKind::kMultiplicative;
  struct Bad {
    const BackendWeights *base, *current;
    const BackendLossStats* stats;
    std::string want;
  } cases[] = {
      {&foreign, own.get(), own_stats->get(), "base: made by another backend"},
      {own.get(), &foreign, own_stats->get(), "current: made by another backend"},
      {own.get(), own.get(), &foreign_stats, "stats: made by another backend"},
  };
  for (const Bad& c : cases) {
    absl::Status s = backend->RecomputeWeights(p, 0, c.base, c.current, c.stats).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
  }
  absl::Status s = backend->PlanEpoch({3, 3, 0, true}, 0, &foreign).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights: made by another backend"));
  std::vector<float> out(1, 7.0f);
  const std::vector<uint64_t> indices = {0};
  s = backend->ImportanceWeights(foreign, indices, absl::MakeSpan(out));
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights: made by another backend"));
  EXPECT_EQ(out[0], 7.0f);
  // Another CPU backend's objects are host memory too: taken.
  EXPECT_TRUE(NewCpuBackend(1)->PlanEpoch({3, 3, 0, true}, 0, own.get()).ok());
}

TEST(StateTest, PlanEpochChecksTheWeightsSize) {
  auto backend = NewCpuBackend(2);
  const auto w = testutil::WeightsOf(*backend, {1, 1});
  absl::Status s = backend->PlanEpoch({5, 5, 0, true}, 0, w.get()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights: 2 values for num_samples 5"));
}

TEST(StateTest, ImportanceWeightsAreOneOverTheWeight) {
  auto backend = NewCpuBackend(2);
  const auto w = testutil::WeightsOf(*backend, {0.5f, 3.0f, 1e-30f, 1.0f});
  const std::vector<uint64_t> indices = {1, 0, 1, 2, 3};
  std::vector<float> out(indices.size(), 7.0f);
  ASSERT_TRUE(backend->ImportanceWeights(*w, indices, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f / 3.0f, 2.0f, 1.0f / 3.0f, 1.0f / 1e-30f, 1.0f}));

  out.assign(3, 7.0f);
  absl::Status s = backend->ImportanceWeights(*w, indices, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("out: 3 values for 5 indices"));
  EXPECT_EQ(out, std::vector<float>(3, 7.0f));
  const std::vector<uint64_t> outside = {0, 4, 9};
  s = backend->ImportanceWeights(*w, outside, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("indices[1] = 4 is outside [0, num_samples = 4)"));
  EXPECT_EQ(out, std::vector<float>(3, 7.0f));  // Nothing written, not even out[0].
}

TEST(StateTest, LossStatsKeepTheFirstLossOfASampleInAnEpoch) {
  auto backend = NewCpuBackend(2);
  absl::StatusOr<std::unique_ptr<BackendLossStats>> made = backend->NewLossStats(4, 0.75);
  ASSERT_TRUE(made.ok()) << made.status();
  BackendLossStats& stats = **made;
  EXPECT_EQ(stats.size(), 4u);
  EXPECT_EQ(stats.SamplesSeen(), 0u);
  // Arrival order: sample 2's first loss of epoch 0 wins, within a call and across calls.
  const std::vector<uint64_t> i0 = {2, 1, 2};
  const std::vector<float> l0 = {4.0f, 5.0f, 100.0f};
  absl::StatusOr<uint64_t> applied = stats.Apply(0, i0, l0);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(*applied, 2u);
  const std::vector<uint64_t> i1 = {2};
  const std::vector<float> l1 = {7.0f};
  EXPECT_EQ(*stats.Apply(0, i1, l1), 0u);
  std::vector<SampleLossStats> host = HostStats(stats);
  EXPECT_EQ(host[2].ema_loss, 4.0f);
  EXPECT_EQ(host[2].count, 1u);
  EXPECT_EQ(host[2].last_epoch, EpochMarker(0));
  EXPECT_EQ(host[1].ema_loss, 5.0f);
  EXPECT_EQ(host[0].count, 0u);
  EXPECT_EQ(stats.SamplesSeen(), 2u);
  // The next epoch applies again, by the EMA rule (ApplyLoss).
  const std::vector<float> l2 = {8.0f};
  EXPECT_EQ(*stats.Apply(1, i1, l2), 1u);
  host = HostStats(stats);
  SampleLossStats want{4.0f, 1, EpochMarker(0)};
  ApplyLoss(want, 8.0f, EpochMarker(1), 0.75f);
  EXPECT_EQ(host[2].ema_loss, want.ema_loss);
  EXPECT_EQ(host[2].ema_loss, 0.75f * 4.0f + 0.25f * 8.0f);
  EXPECT_EQ(host[2].count, 2u);
  EXPECT_EQ(host[2].last_epoch, EpochMarker(1));
  EXPECT_EQ(stats.SamplesSeen(), 2u);
}

TEST(StateTest, LossStatsRefuseBadInputAndChangeNothing) {
  auto backend = NewCpuBackend(2);
  auto made = backend->NewLossStats(4, 0.9);
  ASSERT_TRUE(made.ok());
  BackendLossStats& stats = **made;
  const std::vector<uint64_t> first = {3};
  const std::vector<float> loss = {1.0f};
  ASSERT_EQ(*stats.Apply(0, first, loss), 1u);
  const std::vector<SampleLossStats> before = HostStats(stats);

  // Restore of another size: nothing changes.
  absl::Status s = stats.Restore(std::vector<SampleLossStats>(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("loss statistics: 3 entries for num_samples 4"));
  EXPECT_TRUE(SameStats(HostStats(stats), before));
  EXPECT_EQ(stats.SamplesSeen(), 1u);
  // An index outside the table: refused before anything is applied.
  const std::vector<uint64_t> outside = {0, 4};
  const std::vector<float> two = {1.0f, 2.0f};
  s = stats.Apply(1, outside, two).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("indices[1] = 4 is outside [0, num_samples = 4)"));
  s = stats.Apply(1, first, two).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("losses: 2 values for 1 indices"));
  EXPECT_TRUE(SameStats(HostStats(stats), before));

  // Restore: the given statistics, and the samples seen counted from them; empty: none seen.
  std::vector<SampleLossStats> restored(4);
  restored[0] = {2.0f, 3, EpochMarker(7)};
  restored[1] = {1.0f, 1, EpochMarker(6)};
  ASSERT_TRUE(stats.Restore(restored).ok());
  EXPECT_TRUE(SameStats(HostStats(stats), restored));
  EXPECT_EQ(stats.SamplesSeen(), 2u);
  EXPECT_EQ(*stats.Apply(7, std::vector<uint64_t>{0}, loss), 0u);  // Seen in epoch 7 already.
  ASSERT_TRUE(stats.Restore({}).ok());
  EXPECT_TRUE(SameStats(HostStats(stats), std::vector<SampleLossStats>(4)));
  EXPECT_EQ(stats.SamplesSeen(), 0u);

  for (double decay : {-0.1, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
    s = backend->NewLossStats(4, decay).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("ema_decay = "));
  }
  s = backend->NewLossStats(0, 0.5).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_samples = 0"));
  // Past the exact sums' limit: refused before 8 TiB are asked for.
  s = backend->NewLossStats((uint64_t{1} << 40) + 1, 0.5).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_samples = 1099511627777: a loss policy"));
}

// ---- Loss within groups (docs/SAMPLING.md, "Loss within groups") -----------------------------

WeightPolicyParams WithinGroupsPolicy() {
  WeightPolicyParams p;
  p.base = BaseWeightKind::kClassBalanced;
  p.loss = LossWeightKind::kLoss;
  p.loss_within_groups = true;
  return p;
}

TEST(WithinGroupsTest, FactorIsNormalisedWithinEachGroupOfEqualBaseWeight) {
  // Groups {0, 1, 2} (base 1) and {3, 4} (base 3); every sample seen. alpha 1, eps 0.5, mix 0,
  // wide clamps. Group 1: x = 0.5, 1.5, 3.5, f = x / 3.5, f / mean_f = 3/11, 9/11, 21/11;
  // group 2: x = 1, 2.5, f / mean_f = 4/7, 10/7. raw = base (f / mean_f): 9 in all, mean 9/5 =
  // the base weights' mean, so w = raw / 1.8.
  WeightPolicyParams p = WithinGroupsPolicy();
  p.epsilon = 0.5;
  p.clamp_lo = 0.01;
  p.clamp_hi = 100;
  const std::vector<float> base = {1, 1, 1, 3, 3};
  const auto stats = Stats({0, 1, 3, 0.5f, 2}, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1});
  std::vector<float> out(5);
  ASSERT_TRUE(Recompute(*NewCpuBackend(2), p, 0, base, {}, stats, out).ok());
  const double want[] = {3.0 / 11, 9.0 / 11, 21.0 / 11, 3 * 4.0 / 7, 3 * 10.0 / 7};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(out[i], want[i] / 1.8, 1e-6) << i;
  // Golden bits (the fixed-point group sums round 1/7 and 0.4: f / mean_f is not exactly 3/11).
  const uint32_t golden[] = {0x3e1b26ca, 0x3ee8ba2e, 0x3f87c1f0, 0x3f73cf3d, 0x40186186};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(weight_math::FloatBits(out[i]), golden[i])
        << i << ": 0x" << std::hex << weight_math::FloatBits(out[i]);
  }
  EXPECT_NEAR((out[3] + out[4]) / 5, 2.0 / 3, 1e-6);  // Group 2's base share, 6 of 9.

  // The global factor (the default) moves weight between the groups: f = x / 3.5 over all five,
  // raw = base f / mean_f = (5, 15, 35, 30, 75) / 18, so group 2's share falls to 105/160.
  p.loss_within_groups = false;
  ASSERT_TRUE(Recompute(*NewCpuBackend(2), p, 0, base, {}, stats, out).ok());
  EXPECT_NEAR((out[3] + out[4]) / 5, 105.0 / 160, 1e-6);
}

// The long tail: counts 100, 64, ..., 2, class-balanced base, the tail's losses low
// (memorised), the head's spread. Within groups every class keeps its base share of the
// weight; the global factor takes share from the tail.
TEST(WithinGroupsTest, EachClassKeepsItsClassBalancedShare) {
  const uint32_t counts[] = {100, 64, 41, 27, 17, 11, 7, 4, 3, 2};
  std::vector<uint32_t> labels;
  for (uint32_t c = 0; c < 10; ++c) labels.insert(labels.end(), counts[c], c);
  const uint64_t n = labels.size();
  std::vector<float> base(n);
  ASSERT_TRUE(ClassBalancedWeights(labels, 0.0, absl::MakeSpan(base)).ok());
  std::vector<SampleLossStats> stats(n);
  for (uint64_t i = 0; i < n; ++i) {
    const float ema = labels[i] >= 7 ? 0.01f : 0.1f + static_cast<float>(i % 13) * 0.25f;
    stats[i] = {ema, 3, 3};
  }
  WeightPolicyParams p = WithinGroupsPolicy();
  p.clamp_lo = 1e-3;
  p.clamp_hi = 1e3;
  std::vector<float> within(n), global(n);
  ASSERT_TRUE(Recompute(*NewCpuBackend(2), p, 3, base, {}, stats, within).ok());
  p.loss_within_groups = false;
  ASSERT_TRUE(Recompute(*NewCpuBackend(2), p, 3, base, {}, stats, global).ok());
  auto share = [&](const std::vector<float>& w, uint32_t c) {
    double in_class = 0, all = 0;
    for (uint64_t i = 0; i < n; ++i) {
      all += w[i];
      if (labels[i] == c) in_class += w[i];
    }
    return in_class / all;
  };
  for (uint32_t c = 0; c < 10; ++c) {
    EXPECT_NEAR(share(within, c), 0.1, 1e-6) << "class " << c;
  }
  for (uint32_t c = 7; c < 10; ++c) {
    EXPECT_LT(share(global, c), 0.05) << "class " << c << ": the global factor's tail share";
  }
  // Within a head class the hard samples still gain: the largest EMA of class 0 gets the most.
  const auto hardest = std::max_element(
      stats.begin(), stats.begin() + 100,
      [](const SampleLossStats& a, const SampleLossStats& b) { return a.ema_loss < b.ema_loss; });
  EXPECT_EQ(*std::max_element(within.begin(), within.begin() + 100),
            within[hardest - stats.begin()]);
}

TEST(WithinGroupsTest, GoldenHashIndependentOfThreads) {
  const uint64_t n = 100003;
  std::vector<uint32_t> labels(n);
  for (uint64_t i = 0; i < n; ++i) labels[i] = static_cast<uint32_t>((i * i) % 37);
  std::vector<float> base(n);
  ASSERT_TRUE(ClassBalancedWeights(labels, 0.0, absl::MakeSpan(base)).ok());
  WeightPolicyParams p = WithinGroupsPolicy();
  p.alpha = 2;
  p.mix = 0.2;
  const std::vector<SampleLossStats> stats = VariedStats(n, 13);
  for (int threads : {1, 2, 3}) {
    std::vector<float> out(n);
    ASSERT_TRUE(Recompute(*NewCpuBackend(threads), p, 5, base, {}, stats, out).ok());
    EXPECT_EQ(Fnv1a(out), 0x3fde15a8e3772396ull)
        << threads << " threads: 0x" << std::hex << Fnv1a(out);
  }
}

TEST(WithinGroupsTest, BadInputsNameFieldAndValueAndChangeNothing) {
  WeightPolicyParams p = WithinGroupsPolicy();
  p.base = BaseWeightKind::kUniform;
  absl::Status s = ValidatePolicy(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("policy.loss_within_groups = true needs"));
  p = WithinGroupsPolicy();
  p.loss = LossWeightKind::kMultiplicative;
  EXPECT_EQ(ValidatePolicy(p).code(), absl::StatusCode::kInvalidArgument);

  // No base weights given to the recompute: named, `out` unchanged.
  const uint64_t n = 10;
  const std::vector<SampleLossStats> stats = VariedStats(n, 3);
  std::vector<float> out(n, 7.0f);
  s = Recompute(*NewCpuBackend(2), WithinGroupsPolicy(), 1, {}, {}, stats, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("base: missing; policy.loss_within_groups"));
  EXPECT_EQ(out, std::vector<float>(n, 7.0f));

  // More than kMaxLossGroups distinct base weights: refused at the upload (CheckLossGroups)
  // and, should such weights reach it, by the recompute.
  const uint64_t many = kMaxLossGroups + 1;
  std::vector<float> distinct(many);
  for (uint64_t i = 0; i < many; ++i) distinct[i] = 1.0f + static_cast<float>(i) / 65536.0f;
  s = CheckLossGroups(WithinGroupsPolicy(), distinct);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("base: more than 65536 distinct weights"));
  EXPECT_TRUE(
      CheckLossGroups(WithinGroupsPolicy(), absl::MakeConstSpan(distinct).first(many - 1)).ok());
  EXPECT_TRUE(CheckLossGroups(WeightPolicyParams{}, distinct).ok());
  std::vector<float> big_out(many, 7.0f);
  s = Recompute(*NewCpuBackend(2), WithinGroupsPolicy(), 1, distinct, {}, VariedStats(many, 4),
                big_out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big_out, std::vector<float>(many, 7.0f));
}

// A mixture job's window through the backend (ComputeBackend::PlanMixtureWindow) is
// mixture::PlanWindowInto's, entry for entry, and so are the cursors after it, window after
// window (testutil::WindowMixes); on 1 and 3 threads (the reference on 1).
TEST(MixtureWindowTest, IsPlanWindowInto) {
  for (int threads : {1, 3}) {
    std::unique_ptr<ComputeBackend> backend = NewCpuBackend(threads);
    for (const testutil::WindowMix& mix : testutil::WindowMixes(/*large=*/false)) {
      testutil::ForEachWindow(mix, [&](const std::string& what, const mixture::GroupLayout& layout,
                                       uint64_t epoch,
                                       absl::Span<const mixture::GroupCursor> cursors,
                                       absl::Span<const uint64_t> counts) {
        std::vector<uint64_t> want(mix.m), got(mix.m);
        absl::StatusOr<std::vector<mixture::GroupCursor>> want_next =
            mixture::PlanWindowInto(1, 11, epoch, layout, cursors, counts, absl::MakeSpan(want));
        absl::StatusOr<std::vector<mixture::GroupCursor>> got_next =
            backend->PlanMixtureWindow(11, epoch, layout, cursors, counts, absl::MakeSpan(got));
        ASSERT_TRUE(want_next.ok() && got_next.ok()) << what << ": " << got_next.status();
        EXPECT_EQ(got, want) << what << ", " << threads << " threads";
        for (size_t k = 0; k < cursors.size(); ++k) {
          EXPECT_EQ((*got_next)[k].position, (*want_next)[k].position) << what << " group " << k;
          EXPECT_EQ((*got_next)[k].pass, (*want_next)[k].pass) << what << " group " << k;
        }
      });
    }
  }
}

// A bad window is INVALID_ARGUMENT naming the field and the value, and nothing is written.
TEST(MixtureWindowTest, BadInputNamesTheFieldAndWritesNothing) {
  std::unique_ptr<ComputeBackend> backend = NewCpuBackend(2);
  const mixture::GroupLayout layout = *mixture::GroupLayout::Create({4, 9});
  const std::vector<mixture::GroupCursor> cursors(2);
  std::vector<uint64_t> out(5, 77);
  auto expect_refused = [&](absl::Span<const mixture::GroupCursor> c,
                            absl::Span<const uint64_t> counts, absl::Span<uint64_t> o,
                            const std::string& message) {
    const absl::Status s = backend->PlanMixtureWindow(1, 0, layout, c, counts, o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
    EXPECT_EQ(out, std::vector<uint64_t>(5, 77));
  };
  const std::vector<uint64_t> counts = {2, 3};
  expect_refused(absl::MakeConstSpan(cursors).subspan(0, 1), counts, absl::MakeSpan(out),
                 "cursors: 1 cursors for 2 groups");
  expect_refused(cursors, {5}, absl::MakeSpan(out), "counts: 1 counts for 2 groups");
  const std::vector<mixture::GroupCursor> past = {{0, 0}, {9, 0}};
  expect_refused(past, counts, absl::MakeSpan(out), "cursors[1].position = 9");
  expect_refused(cursors, counts, absl::MakeSpan(out).subspan(0, 4),
                 "out: 4 entries for a window of 5");
}

}  // namespace
}  // namespace samplerd
