// Weight policies and base weights (weight_policy.h): parameter ranges, validation and
// normalisation of uploaded weights, class-balanced weights, the summary.
#include "kernels/weight_policy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

TEST(ValidateTest, WeightsNameTheBadValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<float> w;
    std::string want;
  } cases[] = {
      {{1, nan, 2}, "weights[1] = nan"},
      {{1, 2, -1}, "weights[2] = -1"},
      {{INFINITY}, "weights[0] = inf"},
      {{0, 0, 0}, "all 3 weights are 0"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateWeights(c.w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
  }
  EXPECT_TRUE(ValidateWeights({0, 1}).ok());
}

TEST(NormaliseWeightsTest, ScalesToMeanOneWithTheExactSum) {
  std::vector<float> w = {0, 2, 2, 4};
  ASSERT_TRUE(NormaliseWeights(absl::MakeSpan(w)).ok());
  EXPECT_THAT(w, ::testing::ElementsAre(0.0f, 1.0f, 1.0f, 2.0f));
  // Plans depend on these exact bits: float(w / (sum / n)), the sum of exact_sum.h (here exact:
  // three floats of nearby exponents fit in its 63 bits), rounded once.
  std::vector<float> odd = {0.1f, 0.7f, 3.3f};
  const long double exact = static_cast<long double>(0.1f) + 0.7f + 3.3f;
  const double mean = static_cast<double>(exact) / 3;
  ASSERT_TRUE(NormaliseWeights(absl::MakeSpan(odd)).ok());
  EXPECT_EQ(odd[1], static_cast<float>(0.7f / mean));
  // Bad values are reported as ValidateWeights does, and nothing is written.
  std::vector<float> bad = {1, -1};
  EXPECT_THAT(std::string(NormaliseWeights(absl::MakeSpan(bad)).message()),
              HasSubstr("weights[1] = -1"));
  EXPECT_THAT(bad, ::testing::ElementsAre(1.0f, -1.0f));
}

// The input: one weight near the float maximum and 999 at the smallest subnormal. Once
// divided by the mean (3.4e35) the small ones were 0: OK with zero_count 999 with replacement,
// "1 have [positive weight]" without. Now the upload is rejected, naming the ratio.
TEST(NormaliseWeightsTest, RejectsARatioBeyond2To126NamingIt) {
  std::vector<float> w(1000, 1e-45f);
  w[0] = 3.4e38f;
  const std::vector<float> before = w;
  const absl::Status s = NormaliseWeights(absl::MakeSpan(w));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights[0] = 3.4e+38"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights[1] = 1.4013e-45"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2.42632e+83 (2^277.0) times the smallest"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("at most 2^126"));
  EXPECT_EQ(w, before);
  // Just beyond the bound, zeros aside (they are not part of the ratio).
  std::vector<float> over = {0, 0x1p100f, 0x1p-26f, 0x1p-27f};
  EXPECT_EQ(NormaliseWeights(absl::MakeSpan(over)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NormaliseWeightsTest, AtTheBoundEveryPositiveWeightStaysANormalFloat) {
  // Ratio exactly 2^126, the small weights as rare as possible (the mean is then near the
  // largest weight): each normalised small weight is still >= FLT_MIN, so 1 / w is finite.
  std::vector<float> w(1000, 0x1p-26f);
  w[0] = 0x1p100f;
  ASSERT_TRUE(NormaliseWeights(absl::MakeSpan(w)).ok());
  for (float x : w) {
    EXPECT_GE(x, std::numeric_limits<float>::min());
    EXPECT_TRUE(std::isfinite(1.0f / x));
  }
  std::vector<float> single = {0, 0, 0x1p-149f};  // One positive weight: ratio 1.
  ASSERT_TRUE(NormaliseWeights(absl::MakeSpan(single)).ok());
  EXPECT_EQ(single[2], 3.0f);
}

TEST(ValidateTest, PolicyRangesNameFieldAndValue) {
  struct Case {
    void (*mutate)(WeightPolicyParams*);
    std::string want;
  } cases[] = {
      {[](WeightPolicyParams* p) { p->alpha = -1; }, "policy.alpha = -1"},
      {[](WeightPolicyParams* p) { p->alpha = 9; }, "policy.alpha = 9"},
      {[](WeightPolicyParams* p) { p->ema_decay = 1; }, "policy.ema_decay = 1"},
      {[](WeightPolicyParams* p) { p->epsilon = 0; }, "policy.epsilon = 0"},
      {[](WeightPolicyParams* p) { p->mix = 1.5; }, "policy.mix = 1.5"},
      {[](WeightPolicyParams* p) { p->clamp_lo = 2; }, "policy.clamp_lo = 2"},
      {[](WeightPolicyParams* p) { p->clamp_hi = 0.5; }, "policy.clamp_hi = 0.5"},
      {[](WeightPolicyParams* p) { p->eta = NAN; }, "policy.eta = nan"},
      {[](WeightPolicyParams* p) { p->class_balance_beta = 1; }, "policy.class_balance_beta = 1"},
      {[](WeightPolicyParams* p) { p->prior_loss = -2; }, "policy.prior_loss = -2"},
      {[](WeightPolicyParams* p) { p->min_effective_fraction = 2; },
       "policy.min_effective_fraction = 2 is outside [0, 1]"},
      {[](WeightPolicyParams* p) { p->min_effective_fraction = -0.5; },
       "policy.min_effective_fraction = -0.5 is outside [0, 1]"},
      {[](WeightPolicyParams* p) { p->min_effective_fraction = NAN; },
       "policy.min_effective_fraction = nan is outside [0, 1]"},
      {[](WeightPolicyParams* p) {
         p->loss = LossWeightKind::kMultiplicative;
         p->min_effective_fraction = 0.5;
       },
       "policy.min_effective_fraction = 0.5 needs loss = LOSS or REDUCIBLE_LOSS"},
      {[](WeightPolicyParams* p) { p->min_effective_fraction = 0.5; },  // loss kNone.
       "policy.min_effective_fraction = 0.5 needs loss = LOSS or REDUCIBLE_LOSS"},
      {[](WeightPolicyParams* p) {
         p->loss = LossWeightKind::kMultiplicative;
         p->base = BaseWeightKind::kStatic;
         p->loss_within_groups = true;
       },
       "policy.loss_within_groups = true needs loss = LOSS or REDUCIBLE_LOSS"},
  };
  for (const Case& c : cases) {
    WeightPolicyParams p;
    c.mutate(&p);
    absl::Status s = ValidatePolicy(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
  }
  EXPECT_TRUE(ValidatePolicy(WeightPolicyParams()).ok());
}

TEST(ValidateTest, ReducibleLossTakesLossParametersAndTheFloor) {
  WeightPolicyParams p;
  p.loss = LossWeightKind::kReducibleLoss;
  p.base = BaseWeightKind::kClassBalanced;
  p.loss_within_groups = true;
  p.min_effective_fraction = 1;
  p.alpha = 2;
  p.mix = 0.1;
  EXPECT_TRUE(ValidatePolicy(p).ok());
  p.loss = LossWeightKind::kLoss;
  p.min_effective_fraction = 0.25;
  EXPECT_TRUE(ValidatePolicy(p).ok());
}

TEST(ValidateTest, IrreducibleLossesNameTheBadValue) {
  struct Case {
    std::vector<float> losses;
    std::string want;
  } cases[] = {
      {{0, 1, 2}, "irreducible_losses: 3 values for num_samples 4"},
      {{0, 1, 2, 3, 4}, "irreducible_losses: 5 values for num_samples 4"},
      {{0, 1, NAN, 3}, "irreducible_losses[2] = nan: must be finite and >= 0"},
      {{0, -1, 2, 3}, "irreducible_losses[1] = -1: must be finite and >= 0"},
      {{0, 1, 2, INFINITY}, "irreducible_losses[3] = inf: must be finite and >= 0"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateIrreducibleLosses(c.losses, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_EQ(s.message(), c.want);
  }
  // Zeros (of either sign) are irreducible losses: the policy is then LOSS.
  EXPECT_TRUE(ValidateIrreducibleLosses(std::vector<float>{0, -0.0f, 0, 7}, 4).ok());
}

TEST(ClassBalancedTest, InverseCountAndEffectiveNumber) {
  // Labels: class 0 x3, class 7 x1.
  const std::vector<uint32_t> labels = {0, 0, 7, 0};
  std::vector<float> w(4);
  ASSERT_TRUE(ClassBalancedWeights(labels, 0.0, absl::MakeSpan(w)).ok());
  // Raw 1/3,1/3,1,1/3; mean 0.5 -> 2/3, 2/3, 2, 2/3.
  EXPECT_FLOAT_EQ(w[0], 2.0f / 3);
  EXPECT_FLOAT_EQ(w[2], 2.0f);
  // Effective number, beta 0.5: class 0: 0.5 / (1 - 0.125) = 4/7; class 7: 0.5 / 0.5 = 1.
  ASSERT_TRUE(ClassBalancedWeights(labels, 0.5, absl::MakeSpan(w)).ok());
  const double mean = (3 * 4.0 / 7 + 1) / 4;
  EXPECT_NEAR(w[0], 4.0 / 7 / mean, 1e-6);
  EXPECT_NEAR(w[2], 1.0 / mean, 1e-6);

  std::vector<float> out = {9, 9, 9};
  absl::Status s = ClassBalancedWeights(labels, 0.0, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("labels: 4 values for num_samples 3"));
  EXPECT_EQ(out, (std::vector<float>{9, 9, 9}));  // Untouched.
}

TEST(SummaryTest, EffectiveSampleSize) {
  const WeightSummary s = SummarizeWeights({1, 1, 0, 2});
  EXPECT_DOUBLE_EQ(s.min, 0);
  EXPECT_DOUBLE_EQ(s.max, 2);
  EXPECT_DOUBLE_EQ(s.mean, 1);
  EXPECT_DOUBLE_EQ(s.effective_sample_size, 16.0 / 6.0);
  EXPECT_EQ(s.zero_count, 1u);
}

// Weights whose sum in double depends on the order of addition: values from 2^-40 to 2^40.
std::vector<float> WideWeights(uint64_t n, uint64_t seed) {
  std::vector<float> w(n);
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
    const int exponent = static_cast<int>(s % 81) - 40;
    w[i] = i % 17 == 0 ? 0.0f : static_cast<float>(std::ldexp(1.0 + u, exponent));
  }
  return w;
}

bool SameBits(const WeightSummary& a, const WeightSummary& b) {
  return std::memcmp(&a.min, &b.min, sizeof(double)) == 0 &&
         std::memcmp(&a.max, &b.max, sizeof(double)) == 0 &&
         std::memcmp(&a.mean, &b.mean, sizeof(double)) == 0 &&
         std::memcmp(&a.effective_sample_size, &b.effective_sample_size, sizeof(double)) == 0 &&
         a.zero_count == b.zero_count;
}

TEST(SummaryTest, DoesNotDependOnTheOrderOfTheWeights) {
  // Several exact-sum chunks (4096), a partial last one.
  const std::vector<float> w = WideWeights(50'001, 3);
  std::vector<float> reversed(w.rbegin(), w.rend());
  std::vector<float> permuted = w;
  std::mt19937_64 rng(11);
  std::shuffle(permuted.begin(), permuted.end(), rng);
  const WeightSummary s = SummarizeWeights(w);
  EXPECT_TRUE(SameBits(s, SummarizeWeights(reversed)));
  EXPECT_TRUE(SameBits(s, SummarizeWeights(permuted)));
  // The test has power: sequential sums in double of these weights depend on the order.
  auto naive = [](const std::vector<float>& v) {
    double sum = 0, sum_sq = 0;
    for (float x : v) sum += x, sum_sq += double{x} * x;
    return std::make_pair(sum, sum_sq);
  };
  EXPECT_NE(naive(w), naive(permuted));

  // Against a long double reference.
  long double sum = 0, sum_sq = 0;
  for (float x : w) sum += x, sum_sq += static_cast<long double>(x) * x;
  const double mean = static_cast<double>(sum / w.size());
  const double ess = static_cast<double>(sum * sum / sum_sq);
  EXPECT_NEAR(s.mean, mean, 1e-12 * mean);
  EXPECT_NEAR(s.effective_sample_size, ess, 1e-12 * ess);
  EXPECT_EQ(s.zero_count, static_cast<uint64_t>(std::count(w.begin(), w.end(), 0.0f)));
  EXPECT_EQ(s.min, 0.0);
  EXPECT_EQ(s.max, double{*std::max_element(w.begin(), w.end())});
}

TEST(SummaryTest, ChunksCombineInAnyOrder) {
  // A backend summarises chunks in parallel and combines them in any order: the same bits.
  const std::vector<float> w = WideWeights(30'000, 5);
  std::vector<WeightChunkSummary> chunks;
  for (size_t b = 0; b < w.size(); b += exact_sum::kChunk) {
    chunks.push_back(
        SummarizeWeightChunk(w.data() + b, std::min<size_t>(exact_sum::kChunk, w.size() - b)));
  }
  std::reverse(chunks.begin(), chunks.end());
  EXPECT_TRUE(SameBits(CombineWeightChunks(chunks, w.size()), SummarizeWeights(w)));
}

TEST(SummaryTest, AZeroIsPositiveWhateverItsSign) {
  // -0 and +0 compare equal, so which one a minimum keeps would depend on the order.
  for (const std::vector<float>& w :
       {std::vector<float>{-0.0f, 0.0f, 1.0f}, std::vector<float>{0.0f, -0.0f, 1.0f},
        std::vector<float>{-0.0f, -0.0f}}) {
    const WeightSummary s = SummarizeWeights(w);
    EXPECT_EQ(s.min, 0.0);
    EXPECT_FALSE(std::signbit(s.min));
    EXPECT_FALSE(std::signbit(s.max));
    EXPECT_EQ(s.zero_count, 2u);
  }
  const WeightSummary none = SummarizeWeights({});
  EXPECT_EQ(none.mean, 0.0);
  EXPECT_EQ(none.effective_sample_size, 0.0);
  EXPECT_EQ(SummarizeWeights({0.0f, 0.0f}).effective_sample_size, 0.0);
}

}  // namespace
}  // namespace samplerd
