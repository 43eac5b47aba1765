#include "kernels/internal/det_math_batch.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/det_math.h"

namespace samplerd {
namespace internal {
namespace {

// Inputs over the whole double range: random bit patterns (every sign, exponent, subnormals,
// infinities, NaNs), random values in the ranges the weight policies use, and edge cases.
std::vector<double> Inputs(double lo, double hi) {
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           2.0,
                           0.5,
                           1.4142135623730951,
                           1.4142135623730954,
                           std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::min(),
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           -1.0,
                           -1075.0,
                           -1075.5,
                           -1074.0,
                           -1022.0,
                           -1022.5,
                           1023.9,
                           1024.0,
                           -0.25};
  uint64_t s = 17;
  for (int k = 0; k < 200'000; ++k) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(det::FromBits(s));
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
    v.push_back(lo + (hi - lo) * u);
  }
  return v;
}

TEST(DetMathBatchTest, Log2ManyIsBitIdentical) {
  const std::vector<double> x = Inputs(0, 1e6);
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<double> out(x.size());
    Log2ManyWith(level, x.data(), x.size(), out.data());
    for (size_t k = 0; k < x.size(); ++k) {
      ASSERT_EQ(det::Bits(out[k]), det::Bits(det::Log2(x[k])))
          << "x = " << x[k] << ", level " << static_cast<int>(level);
    }
  }
}

TEST(DetMathBatchTest, Exp2ManyIsBitIdentical) {
  const std::vector<double> y = Inputs(-1100, 1100);
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<double> out(y.size());
    Exp2ManyWith(level, y.data(), y.size(), out.data());
    for (size_t k = 0; k < y.size(); ++k) {
      ASSERT_EQ(det::Bits(out[k]), det::Bits(det::Exp2(y[k])))
          << "y = " << y[k] << ", level " << static_cast<int>(level);
    }
  }
}

TEST(DetMathBatchTest, InPlace) {
  std::vector<double> v = {1.0, 8.0, 0.125};
  Log2Many(v.data(), v.size(), v.data());
  EXPECT_EQ(v, (std::vector<double>{0.0, 3.0, -3.0}));
  Exp2Many(v.data(), v.size(), v.data());
  EXPECT_EQ(v, (std::vector<double>{1.0, 8.0, 0.125}));
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
