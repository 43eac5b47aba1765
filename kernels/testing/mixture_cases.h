// Mixture windows shared by the tests that compare two computations of a window (the CPU
// backend's with PlanWindowInto, cpu_backend_test; the CUDA backend's with the CPU backend's,
// cuda_backend_test): groups smaller than the window (wrapping into several passes per window),
// windows smaller than K, M a multiple of nothing in particular, zero weights, K up to 10^4 and
// N = 10^12.
#ifndef SAMPLERD_KERNELS_TESTING_MIXTURE_CASES_H_
#define SAMPLERD_KERNELS_TESTING_MIXTURE_CASES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/window.h"

namespace samplerd {
namespace testutil {

struct WindowMix {
  std::vector<uint64_t> sizes;
  std::vector<double> weights;  // One per group.
  uint64_t m;                   // The window.
  int windows;                  // How many windows in a row.
};

// `large`: with the mixes of K = 10^4 and N = 10^12 (windows of ~10^6 entries).
inline std::vector<WindowMix> WindowMixes(bool large) {
  std::vector<WindowMix> mixes = {
      {{1, 2, 3, 50}, {1, 1, 1, 1}, 16, 20},
      {{13}, {1}, 1000, 3},
      {{5, 200, 31, 8, 999, 2}, {1, 4, 2, 0.1, 8, 0.5}, 257, 10},
      {{1000, 17, 1, 333}, {0.5, 3, 0.25, 1}, 100003, 4},
      {{7, 7, 7, 7, 7, 7, 7, 7, 7, 7}, {1, 0, 2, 0, 3, 0, 4, 0, 5, 6}, 3, 12},
  };
  if (large) {
    mixes.push_back(
        {std::vector<uint64_t>(10000, 100000000), std::vector<double>(10000, 1.0), 1000003, 2});
    mixes.push_back({{uint64_t{1} << 40, 3, (uint64_t{1} << 33) + 1}, {1, 1, 1}, 2999999, 2});
  }
  return mixes;
}

// Calls fn(what, layout, epoch, cursors, counts) for each window of `mix` in turn (epochs 0,
// 1, ...: the apportionment's counts, the cursors from 0, advanced by CursorsAfter); `what`
// names the mix and the window for a failure message.
template <typename Fn>
void ForEachWindow(const WindowMix& mix, Fn&& fn) {
  const mixture::GroupLayout layout = *mixture::GroupLayout::Create(mix.sizes);
  const std::vector<uint64_t> shares = *mixture::SharesOf(mix.weights);
  mixture::Apportioner apportioner = *mixture::Apportioner::Create(mix.sizes.size());
  std::vector<mixture::GroupCursor> cursors(mix.sizes.size());
  for (int epoch = 0; epoch < mix.windows; ++epoch) {
    const std::vector<uint64_t> counts = apportioner.Next(shares, mix.m)->counts;
    const std::string what =
        absl::StrCat("K = ", mix.sizes.size(), ", M = ", mix.m, ", window ", epoch);
    fn(what, layout, static_cast<uint64_t>(epoch), absl::MakeConstSpan(cursors),
       absl::MakeConstSpan(counts));
    cursors = mixture::CursorsAfter(layout, cursors, counts);
  }
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_MIXTURE_CASES_H_
