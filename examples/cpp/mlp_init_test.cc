#include "examples/cpp/mlp_init.h"

#include <cmath>

#include "gtest/gtest.h"

namespace samplerd {
namespace examples {
namespace {

TEST(MlpShapeTest, LayoutIsContiguous) {
  const MlpShape s{3, 4, 2};
  EXPECT_EQ(s.b1(), 12u);
  EXPECT_EQ(s.w2(), 16u);
  EXPECT_EQ(s.b2(), 24u);
  EXPECT_EQ(s.param_count(), 26u);
}

TEST(InitialParamsTest, SameSeedSameParamsWeightsBoundedBiasesZero) {
  const MlpShape s{32, 64, 4};
  const std::vector<float> a = InitialParams(s, 7);
  EXPECT_EQ(a, InitialParams(s, 7));
  EXPECT_NE(a, InitialParams(s, 8));
  ASSERT_EQ(a.size(), s.param_count());
  const double limit1 = std::sqrt(6.0 / (32 + 64)), limit2 = std::sqrt(6.0 / (64 + 4));
  double max1 = 0.0;
  for (size_t i = s.w1(); i < s.b1(); ++i) {
    EXPECT_LE(std::fabs(a[i]), limit1);
    max1 = std::max(max1, static_cast<double>(std::fabs(a[i])));
  }
  EXPECT_GT(max1, 0.9 * limit1);  // Spread over the range, not all near zero.
  for (size_t i = s.w2(); i < s.b2(); ++i) EXPECT_LE(std::fabs(a[i]), limit2);
  for (size_t i = s.b1(); i < s.w2(); ++i) EXPECT_EQ(a[i], 0.0f);
  for (size_t i = s.b2(); i < s.param_count(); ++i) EXPECT_EQ(a[i], 0.0f);
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
