#include "kernels/det_math.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace samplerd::det {
namespace {

TEST(DetMathTest, Log2IsExactAtPowersOfTwo) {
  for (int k = -1074; k <= 1023; ++k) {
    EXPECT_EQ(Log2(std::ldexp(1.0, k)), static_cast<double>(k)) << "k = " << k;
  }
}

TEST(DetMathTest, Log2MatchesLibmClosely) {
  uint64_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double x = UniformOpen01(state) * std::ldexp(1.0, static_cast<int>(state % 200) - 100);
    const double want = std::log2(x);
    EXPECT_NEAR(Log2(x), want, 4e-16 * std::max(1.0, std::fabs(want))) << "x = " << x;
  }
}

TEST(DetMathTest, Exp2AndPowMatchLibmClosely) {
  for (double y = -60; y < 60; y += 0.0137) {
    EXPECT_NEAR(Exp2(y), std::exp2(y), 2e-15 * std::exp2(y)) << "y = " << y;
  }
  for (double x : {0.001, 0.5, 1.0, 1.7, 3.0, 1e5}) {
    for (double a : {0.0, 0.25, 1.0, 2.0, 7.5}) {
      EXPECT_NEAR(Pow(x, a), std::pow(x, a), 1e-13 * std::pow(x, a)) << x << "^" << a;
    }
  }
  EXPECT_EQ(Exp2(3.0), 8.0);
  EXPECT_EQ(Pow(0.0, 2.0), 0.0);
  EXPECT_EQ(Exp2(2000.0), INFINITY);
  EXPECT_EQ(Exp2(-2000.0), 0.0);
}

TEST(DetMathTest, UniformOpen01NeverHitsTheEnds) {
  EXPECT_GT(UniformOpen01(0), 0.0);
  EXPECT_LT(UniformOpen01(~uint64_t{0}), 1.0);
  EXPECT_TRUE(std::isfinite(-Log2(UniformOpen01(~uint64_t{0}))));
  EXPECT_GT(-Log2(UniformOpen01(~uint64_t{0})), 0.0);
}

}  // namespace
}  // namespace samplerd::det
