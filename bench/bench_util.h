// Small helpers shared by the benchmark drivers (not a library for anything else).
#ifndef SAMPLERD_BENCH_BENCH_UTIL_H_
#define SAMPLERD_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"

// Evaluates an absl::Status expression; prints it with the place and exits 1 if it is not OK
// (a benchmark has nobody to return an error to).
#define CHECK_OK_OR_DIE(expr)                                                         \
  do {                                                                                \
    absl::Status _s = (expr);                                                         \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace samplerd {
namespace bench {

// The median of `v` (the upper one for an even count); `v` must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
}  // namespace samplerd

#endif  // SAMPLERD_BENCH_BENCH_UTIL_H_
