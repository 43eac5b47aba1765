// Helpers for the kernels' and the server's tests: reproducible inputs, plans as vectors and
// statistics.
#ifndef SAMPLERD_KERNELS_TESTING_TEST_UTIL_H_
#define SAMPLERD_KERNELS_TESTING_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/plan.h"
#include "kernels/testing/weight_cases.h"

namespace samplerd {
namespace testutil {

// A plan's indices as 64-bit values, whichever width it stores.
inline std::vector<uint64_t> PlanIndices(const Plan& plan) {
  std::vector<uint64_t> v(plan.size());
  for (uint64_t p = 0; p < v.size(); ++p) v[p] = plan[p];
  return v;
}

// RandomWeights: weight_cases.h.

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

#endif  // SAMPLERD_KERNELS_TESTING_TEST_UTIL_H_
