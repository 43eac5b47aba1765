// The pass order (pass_order.h) against its definition (docs/SAMPLING.md, "Mixture jobs"):
// a bijection of [0, n) for every n (exhaustively up to 2000, by sampling up to 2^63), a new
// order per pass, group and seed, positions uniform (chi-square with a fixed seed), the
// cycle-walk cost, and golden values that pin the definition (the CUDA kernel must match them).
#include "kernels/mixture/pass_order.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"

namespace samplerd {
namespace mixture {
namespace {

// The definition written out separately: the rounds as a list of (width of A, width of B) and
// the round function from the Philox call, the cycle walk from the network.
uint64_t DefinitionAt(uint64_t seed, uint32_t group, uint64_t pass, uint64_t n, uint64_t j) {
  if (n == 1) return 0;
  int b = 0;
  while (b < 64 && ((n - 1) >> b) != 0) ++b;
  const Philox4x32Counter key =
      Philox4x32_10({{group, static_cast<uint32_t>(pass), static_cast<uint32_t>(pass >> 32), 5u}},
                    {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
  const auto network = [&](uint64_t x) {
    int wa = b / 2, wb = b - b / 2;
    uint64_t a = x >> wb, lo = x % (uint64_t{1} << wb);
    for (uint32_t r = 0; r < 6; ++r) {
      const uint32_t f = Philox4x32_10({{static_cast<uint32_t>(lo), r, key.v[2], key.v[3]}},
                                       {{key.v[0], key.v[1]}})
                             .v[0];
      const uint64_t c = a ^ (f % (uint64_t{1} << wa));
      a = lo;
      lo = c;
      std::swap(wa, wb);
    }
    return a * (uint64_t{1} << wb) + lo;
  };
  uint64_t x = network(j);
  while (x >= n) x = network(x);
  return x;
}

TEST(PassOrderTest, IsTheDefinition) {
  for (uint64_t n : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{5}, uint64_t{64},
                     uint64_t{1000}, uint64_t{1} << 40, (uint64_t{1} << 63) - 3}) {
    const PassOrder order(MakePassKey(42, 7, 3), n);
    for (uint64_t j = 0; j < std::min<uint64_t>(n, 300); ++j) {
      ASSERT_EQ(order.At(j), DefinitionAt(42, 7, 3, n, j)) << "n=" << n << " j=" << j;
    }
  }
}

// Pins the definition: a change here changes every mixture plan (only deliberately).
TEST(PassOrderTest, GoldenValues) {
  const PassOrder small(MakePassKey(42, 3, 7), 10);
  std::vector<uint64_t> got;
  for (uint64_t j = 0; j < 10; ++j) got.push_back(small.At(j));
  EXPECT_EQ(got, (std::vector<uint64_t>{6, 0, 5, 7, 1, 9, 3, 8, 4, 2}));
  const PassOrder large(MakePassKey(0x123456789abcdefull, 999999, 1ull << 40), 1000000000000ull);
  got.clear();
  for (uint64_t j : {0ull, 1ull, 999999999999ull}) got.push_back(large.At(j));
  EXPECT_EQ(got, (std::vector<uint64_t>{777422687476ull, 47776921659ull, 980527725239ull}));
}

TEST(PassOrderTest, BijectionForEveryNUpTo2000) {
  for (uint64_t seed : {1ull, 0xfeedfacecafebeefull}) {
    for (uint64_t n = 1; n <= 2000; ++n) {
      const PassOrder order(MakePassKey(seed, static_cast<uint32_t>(n), n * 31), n);
      std::vector<bool> seen(n, false);
      for (uint64_t j = 0; j < n; ++j) {
        const uint64_t x = order.At(j);
        ASSERT_LT(x, n) << "seed=" << seed << " j=" << j;
        ASSERT_FALSE(seen[x]) << "n=" << n << ": " << x << " twice";
        seen[x] = true;
        ASSERT_EQ(order.IndexOf(x), j) << "n=" << n;
      }
    }
  }
}

TEST(PassOrderTest, BijectionForLargeNBySampling) {
  for (uint64_t n : {uint64_t{1} << 63, (uint64_t{1} << 63) - 1, uint64_t{1000000000000},
                     (uint64_t{1} << 40) + 7, (uint64_t{1} << 32) + 1, uint64_t{3} << 31}) {
    const PassOrder order(MakePassKey(5, 1, 2), n);
    std::vector<uint64_t> outputs;
    constexpr uint64_t kSamples = 40000;
    for (uint64_t t = 0; t < kSamples; ++t) {
      const uint64_t j = MulHi64(RandomBits64(77, 0, RandomStream::kDraw, t), n);
      const uint64_t x = order.At(j);
      ASSERT_LT(x, n);
      ASSERT_EQ(order.IndexOf(x), j) << "n=" << n;
      outputs.push_back(x);
    }
    // The 40000 sampled j are distinct with probability ~1 - 1e-6 at n = 3 2^31; the inverse
    // above already proves their images distinct whenever they are.
    std::sort(outputs.begin(), outputs.end());
    EXPECT_EQ(std::unique(outputs.begin(), outputs.end()) - outputs.begin(), kSamples) << n;
  }
}

TEST(PassOrderTest, PassesGroupsAndSeedsGiveDifferentOrders) {
  constexpr uint64_t kN = 1000;
  const auto order_of = [](uint64_t seed, uint32_t group, uint64_t pass) {
    const PassOrder order(MakePassKey(seed, group, pass), kN);
    std::vector<uint64_t> v(kN);
    for (uint64_t j = 0; j < kN; ++j) v[j] = order.At(j);
    return v;
  };
  const std::vector<uint64_t> base = order_of(9, 4, 0);
  for (const auto& other : {order_of(9, 4, 1), order_of(9, 4, uint64_t{1} << 32), order_of(9, 5, 0),
                            order_of(10, 4, 0)}) {
    uint64_t same = 0;
    for (uint64_t j = 0; j < kN; ++j) same += base[j] == other[j];
    EXPECT_LT(same, 10u);  // Two independent orders share ~1 position.
  }
}

// Position uniformity: over 6400 passes, how often element x sits at position j, for n = 64
// (no cycle walk: 2^6) and n = 40 (walks in [0, 64)). A chi-square with (n - 1)^2 degrees of
// freedom; the threshold is 6 standard deviations above its mean (fixed seed: deterministic).
TEST(PassOrderTest, PositionsAreUniform) {
  for (uint64_t n : {uint64_t{64}, uint64_t{40}}) {
    constexpr uint64_t kPasses = 6400;
    std::vector<uint64_t> counts(n * n, 0);
    for (uint64_t pass = 0; pass < kPasses; ++pass) {
      const PassOrder order(MakePassKey(2024, 1, pass), n);
      for (uint64_t j = 0; j < n; ++j) ++counts[order.At(j) * n + j];
    }
    const double expected = static_cast<double>(kPasses) / n;
    double chi2 = 0;
    for (uint64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
    const double df = static_cast<double>((n - 1) * (n - 1));
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << "n=" << n;
    EXPECT_GT(chi2, df - 6 * std::sqrt(2 * df)) << "n=" << n << ": too even to be random";
  }
}

// No correlation between a position and its element: Spearman's rho of (j, At(j)) over a pass
// of n = 4096 is ~N(0, 1/sqrt(n)) for a random permutation; 5 standard deviations.
TEST(PassOrderTest, PositionAndElementAreUncorrelated) {
  constexpr uint64_t kN = 4096;
  for (uint64_t pass = 0; pass < 100; ++pass) {
    const PassOrder order(MakePassKey(31337, 2, pass), kN);
    double sum = 0;
    for (uint64_t j = 0; j < kN; ++j) {
      sum += (static_cast<double>(j) - (kN - 1) / 2.0) *
             (static_cast<double>(order.At(j)) - (kN - 1) / 2.0);
    }
    const double variance = (static_cast<double>(kN) * kN - 1) / 12.0;
    const double rho = sum / kN / variance;
    EXPECT_LT(std::fabs(rho), 5 / std::sqrt(static_cast<double>(kN))) << "pass " << pass;
  }
}

// The cycle walk: the mean over a pass is at most 2^b / n < 2 (the worst n: just above a power of
// two); the longest walk is recorded (about log2 of the pass's size).
TEST(PassOrderTest, CycleWalkCost) {
  for (uint64_t n : {(uint64_t{1} << 16) + 1, uint64_t{100000}, uint64_t{1} << 16}) {
    const PassOrder order(MakePassKey(3, 3, 3), n);
    uint64_t total = 0;
    uint32_t longest = 0;
    for (uint64_t j = 0; j < n; ++j) {
      uint32_t steps = 0;
      order.At(j, &steps);
      total += steps;
      longest = std::max(longest, steps);
    }
    int b = 0;
    while (((n - 1) >> b) != 0) ++b;
    const double mean = static_cast<double>(total) / n;
    EXPECT_LE(mean, static_cast<double>(uint64_t{1} << b) / n) << n;
    EXPECT_LT(longest, 64u) << n;
    if (n == (uint64_t{1} << 16)) EXPECT_EQ(total, n);  // A power of two: no walk.
    std::printf("n=%llu: mean walk %.4f network evaluations, longest %u\n",
                static_cast<unsigned long long>(n), mean, longest);
  }
}

}  // namespace
}  // namespace mixture
}  // namespace samplerd
