#include "kernels/internal/es_select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"
#include "kernels/testing/test_util.h"

namespace samplerd {
namespace internal {
namespace {

using plan_math::EsKeyBits;  // The definition (its own test: kernels/plan_math_test.cc).
using testutil::RandomWeights;

TEST(EsSelectTest, VectorisedKeysAreBitIdentical) {
  // Weights over the whole float range, zeros (both signs) included, and positions whose random
  // bits reach the ends of (0, 1).
  std::vector<float> w = RandomWeights(20'000, 3, 0.05);
  w[1] = 1e-45f;  // Subnormal.
  w[2] = 3.4e38f;
  w[3] = -0.0f;
  w[4] = 1e-30f;
  for (uint64_t first : {uint64_t{0}, uint64_t{123456789}, (uint64_t{1} << 32) - 100}) {
    for (SimdLevel level : SupportedSimdLevels()) {
      std::vector<uint64_t> keys(w.size()), unweighted(w.size());
      EsKeyBitsRangeWith(level, 8, 9, first, w.size(), w.data(), keys.data());
      EsKeyBitsRangeWith(level, 8, 9, first, w.size(), nullptr, unweighted.data());
      for (uint64_t k = 0; k < w.size(); ++k) {
        ASSERT_EQ(keys[k], EsKeyBits(8, 9, first + k, w[k]))
            << "k = " << k << ", level " << static_cast<int>(level);
        ASSERT_EQ(unweighted[k], EsKeyBits(8, 9, first + k, 1.0))
            << "k = " << k << ", level " << static_cast<int>(level);
      }
    }
  }
}

// The definition: sort all (key, index), take m, list in index order.
std::vector<uint64_t> ReferenceSelect(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t m,
                                      const std::vector<float>& w) {
  std::vector<std::pair<uint64_t, uint64_t>> items(n);
  for (uint64_t i = 0; i < n; ++i) {
    items[i] = {EsKeyBits(seed, epoch, i, w.empty() ? 1.0f : w[i]), i};
  }
  std::sort(items.begin(), items.end());
  std::vector<uint64_t> selected;
  for (uint64_t k = 0; k < m; ++k) selected.push_back(items[k].second);
  std::sort(selected.begin(), selected.end());
  return selected;
}

TEST(EsSelectTest, EqualsSortByKeyForAnyThreadCount) {
  // Small inputs take nth_element, larger ones (> 65536) the radix select.
  for (uint64_t n : {1, 2, 10, 1000, 65536, 65537, 400'000}) {
    for (bool weighted : {false, true}) {
      const std::vector<float> w = weighted ? RandomWeights(n, n + 1, 0.2) : std::vector<float>();
      uint64_t positive = n;
      if (weighted) positive = std::count_if(w.begin(), w.end(), [](float x) { return x > 0; });
      if (positive == 0) continue;
      for (uint64_t m : {uint64_t{1}, positive / 3 + 1, positive}) {
        const std::vector<uint64_t> want = ReferenceSelect(4, 5, n, m, w);
        for (int threads : {1, 4}) {
          EXPECT_EQ(SelectEfraimidisSpirakis(threads, 4, 5, n, m, w), want)
              << "n = " << n << ", m = " << m << ", weighted = " << weighted
              << ", threads = " << threads;
        }
      }
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
