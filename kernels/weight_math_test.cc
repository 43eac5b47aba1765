// The per-sample rules of weight_math.h against their plain definitions (std::clamp, std::max,
// the float classes of the validation). Their agreement with the CPU backend's passes is checked
// by recompute_passes_test and cpu_backend_test; with the device by kernels/cuda/identity_test.
#include "kernels/weight_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace samplerd {
namespace weight_math {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(WeightMathTest, SelectPicksBitsWithoutArithmetic) {
  EXPECT_TRUE(SameBits(Select(true, -0.0, 1.0), -0.0));
  EXPECT_TRUE(SameBits(Select(false, 1.0, -0.0), -0.0));
  EXPECT_TRUE(std::isnan(Select(true, std::nan(""), 2.0)));
  EXPECT_EQ(Select(false, std::nan(""), 2.0), 2.0);  // The NaN of an unseen sample is dropped.
}

TEST(WeightMathTest, ValidationClassesOfFloats) {
  struct Case {
    float value;
    uint32_t bad, positive;
  } cases[] = {
      {0.0f, 0, 0},  {-0.0f, 0, 0}, {1e-45f, 0, 1}, {3.4e38f, 0, 1}, {1.0f, 0, 1},  {kInf, 1, 0},
      {-kInf, 1, 0}, {kNaN, 1, 0},  {-kNaN, 1, 0},  {-1e-45f, 1, 0}, {-1.0f, 1, 0},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(BadBits(FloatBits(c.value)), c.bad) << c.value;
    EXPECT_EQ(PositiveBits(FloatBits(c.value)), c.positive) << c.value;
  }
}

TEST(WeightMathTest, SampleIsBadReadsOnlyDefinedEmas) {
  const float base[] = {1.0f, -1.0f}, current[] = {kNaN, 1.0f};
  const SampleLossStats unseen{kNaN, 0, 0}, seen_nan{kNaN, 1, 1}, restored{kNaN, 0, 3};
  EXPECT_FALSE(SampleIsBad(nullptr, nullptr, unseen, 0));
  EXPECT_TRUE(SampleIsBad(nullptr, nullptr, seen_nan, 0));
  EXPECT_TRUE(SampleIsBad(nullptr, nullptr, restored, 0));  // last_epoch > 0: defined.
  EXPECT_TRUE(SampleIsBad(base, nullptr, unseen, 1));
  EXPECT_FALSE(SampleIsBad(base, nullptr, unseen, 0));
  EXPECT_TRUE(SampleIsBad(nullptr, current, unseen, 0));
  EXPECT_FALSE(SampleIsBad(nullptr, current, SampleLossStats{-0.0f, 1, 1}, 1));  // -0: a zero.
}

TEST(WeightMathTest, LossFactorRuleOfTheFirstPass) {
  // Configured prior; the largest x is the prior's when some sample is unseen.
  LossFactorRule r = LossFactorRuleOf(true, 5.0, 0.25, 2.0, 3, 6.0, 4.0f, true);
  EXPECT_EQ(r.prior, 5.0);
  EXPECT_EQ(r.x_max, 5.25);
  EXPECT_EQ(r.log2_x_max, det::Log2(5.25));
  // No unseen sample: the prior does not count.
  r = LossFactorRuleOf(true, 5.0, 0.25, 2.0, 3, 6.0, 4.0f, false);
  EXPECT_EQ(r.x_max, 4.25);
  // The mean EMA of the seen samples as prior.
  r = LossFactorRuleOf(false, 0.0, 0.5, 1.0, 4, 6.0, 3.0f, true);
  EXPECT_EQ(r.prior, 1.5);
  EXPECT_EQ(r.x_max, 3.5);
  // Nothing seen: prior 0, x_max = epsilon.
  r = LossFactorRuleOf(false, 0.0, 1e-3, 1.0, 0, 0.0, 0.0f, true);
  EXPECT_EQ(r.prior, 0.0);
  EXPECT_EQ(r.x_max, 1e-3);
}

TEST(WeightMathTest, LossFactorIsTheRatioToThePowerAlpha) {
  LossFactorRule r = LossFactorRuleOf(true, 1.0, 0.0, 1.0, 1, 2.0, 2.0f, true);
  EXPECT_EQ(LossFactor(true, 2.0f, r), 1.0f);  // The largest x: exactly 1.
  EXPECT_EQ(LossFactor(true, 1.0f, r), 0.5f);
  EXPECT_EQ(LossFactor(false, kNaN, r), 0.5f);  // Unseen: the prior, the EMA is not read.
  r = LossFactorRuleOf(true, 1.0, 0.0, 2.0, 1, 2.0, 2.0f, true);
  EXPECT_EQ(LossFactor(true, 2.0f, r), 1.0f);
  EXPECT_NEAR(LossFactor(true, 1.0f, r), 0.25f, 1e-7);
  // Alpha 8 with losses near the float maximum: no overflow, an underflow to 0 at worst.
  r = LossFactorRuleOf(true, 0.0, 1e-3, 8.0, 1, 3e38, 3e38f, true);
  EXPECT_EQ(LossFactor(true, 3e38f, r), 1.0f);
  EXPECT_EQ(LossFactor(false, 0.0f, r), 0.0f);
}

TEST(WeightMathTest, RawWeights) {
  EXPECT_EQ(LossRaw(2.0, 0.5f, 0.75, 0.5, 0.25), 2.0 * (0.75 * 0.5 / 0.5 + 0.25));
  EXPECT_EQ(MultiplicativeRaw(2.0, 3.0f, true, 0.5), 5.0);
  EXPECT_EQ(MultiplicativeRaw(2.0, kNaN, false, 0.5), 2.0);
}

TEST(WeightMathTest, ClampedIsStdClampOfTheScaledRawWeight) {
  const ClampRule clamp{2.0, 0.1, 10.0};
  for (double raw : {0.0, 0.1, 0.2, 0.21, 1.0, 19.9, 20.0, 20.1, 1e300}) {
    EXPECT_EQ(Clamped(raw, false, clamp), std::clamp(raw / 2.0, 0.1, 10.0)) << raw;
    EXPECT_TRUE(SameBits(Clamped(raw, true, clamp), 0.0)) << raw;
  }
  EXPECT_EQ(Clamped(5.0, false, ClampRule{0.0, 0.1, 10.0}), 1.0);  // Every raw weight vanished.
  EXPECT_EQ(Clamped(0.0, false, ClampRule{0.0, 2.0, 10.0}), 2.0);
  EXPECT_EQ(FinalWeight(1.0, 3.0), static_cast<float>(1.0 / 3.0));
}

TEST(WeightMathTest, Summary) {
  EXPECT_EQ(SummaryBits(-0.0f), 0u);
  EXPECT_EQ(SummaryBits(1.0f), FloatBits(1.0f));
  EXPECT_EQ(SquareTerm(1e-45f), 1.4012984643248171e-45 * 1.4012984643248171e-45);
  EXPECT_TRUE(std::isfinite(SquareTerm(3e38f)));  // In double: no float overflow.
  EXPECT_EQ(EffectiveSampleSize(4.0, 2.0), 8.0);
  EXPECT_EQ(EffectiveSampleSize(0.0, 0.0), 0.0);
  EXPECT_EQ(MeanOf(3.0, 4), 0.75);
}

}  // namespace
}  // namespace weight_math
}  // namespace samplerd
