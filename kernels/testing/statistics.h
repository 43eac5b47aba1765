// Statistics helpers for the kernels' tests.
#ifndef SAMPLERD_KERNELS_TESTING_STATISTICS_H_
#define SAMPLERD_KERNELS_TESTING_STATISTICS_H_

#include <cmath>

namespace samplerd {
namespace testutil {

// Upper tail of the chi-square distribution, P(X >= x) for k degrees of freedom, by the
// regularised incomplete gamma function (series for x < a + 1, continued fraction otherwise).
inline double ChiSquarePValue(double x, double k) {
  const double a = k / 2, z = x / 2;
  if (z <= 0) return 1.0;
  const double log_prefix = a * std::log(z) - z - std::lgamma(a);
  if (z < a + 1) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 100000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - std::exp(log_prefix) * sum;
  }
  // Lentz's continued fraction for Q(a, z).
  double b = z + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_STATISTICS_H_
