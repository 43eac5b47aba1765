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

// The definition written out separately: the round keys from the three Philox calls, the rounds
// as a list of (width of A, width of B) with the round function spelled out, the cycle walk from
// the network.
uint64_t DefinitionAt(uint64_t seed, uint32_t group, uint64_t pass, uint64_t n, uint64_t j) {
  if (n == 1) return 0;
  int b = 0;
  while (b < 64 && ((n - 1) >> b) != 0) ++b;
  uint32_t keys[12];
  for (uint32_t stream = 5; stream <= 7; ++stream) {
    const Philox4x32Counter block = Philox4x32_10(
        {{group, static_cast<uint32_t>(pass), static_cast<uint32_t>(pass >> 32), stream}},
        {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
    for (int w = 0; w < 4; ++w) keys[4 * (stream - 5) + w] = block.v[w];
  }
  const int rounds = b <= 10 ? 12 : 6;
  const auto f = [&](int r, uint64_t half) {
    uint32_t y = static_cast<uint32_t>(half) ^ keys[r];
    y = (y ^ (y >> 16)) * 0x21f0aaadu;
    y = (y ^ (y >> 15)) * 0x735a2d97u;
    return y ^ (y >> 15);
  };
  const auto network = [&](uint64_t x) {
    int wa = b / 2, wb = b - b / 2;
    uint64_t a = x >> wb, lo = x % (uint64_t{1} << wb);
    for (int r = 0; r < rounds; ++r) {
      const uint64_t c = a ^ (f(r, lo) % (uint64_t{1} << wa));
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
  for (uint64_t n :
       {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{5}, uint64_t{64}, uint64_t{1000},
        uint64_t{1024}, uint64_t{1025}, uint64_t{1} << 40, (uint64_t{1} << 63) - 3}) {
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
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 8, 9, 5, 7, 2, 6, 3, 4, 0}));
  const PassOrder large(MakePassKey(0x123456789abcdefull, 999999, 1ull << 40), 1000000000000ull);
  got.clear();
  for (uint64_t j : {0ull, 1ull, 999999999999ull}) got.push_back(large.At(j));
  EXPECT_EQ(got, (std::vector<uint64_t>{352534209444ull, 26731056459ull, 883203155085ull}));
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
// (no cycle walk: 2^6), n = 40 (walks in [0, 64)), and the small groups n = 5 and 12, which get
// 12 rounds (with 6, as large groups have, n = 5 gives a chi-square of 74 here, over its
// threshold of 50; the 12-round figure is 18). A chi-square with (n - 1)^2 degrees of freedom;
// the threshold is 6 standard deviations above its mean (fixed seed: deterministic).
TEST(PassOrderTest, PositionsAreUniform) {
  for (uint64_t n : {uint64_t{64}, uint64_t{40}, uint64_t{5}, uint64_t{12}}) {
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

// Pairs: the ordered pair (At(j), At(j + 1)) at j = n / 2 - 2 (even: the two positions differ in
// their lowest bit only, the inputs a Feistel network separates least) over kPairs passes, for
// n = 64 and 40: uniform over the n (n - 1) ordered pairs of distinct elements. A chi-square with
// n (n - 1) - 1 degrees of freedom, 6 standard deviations (fixed seed).
TEST(PassOrderTest, NeighbouringPositionsAreIndependent) {
  for (uint64_t n : {uint64_t{64}, uint64_t{40}}) {
    const uint64_t cells = n * (n - 1), passes = 20 * cells, j = n / 2 - 2;
    std::vector<uint64_t> counts(n * n, 0);
    for (uint64_t pass = 0; pass < passes; ++pass) {
      const PassOrder order(MakePassKey(77, 9, pass), n);
      ++counts[order.At(j) * n + order.At(j + 1)];
    }
    const double expected = static_cast<double>(passes) / cells;
    double chi2 = 0;
    for (uint64_t x = 0; x < n; ++x) {
      for (uint64_t y = 0; y < n; ++y) {
        if (x == y) {
          ASSERT_EQ(counts[x * n + y], 0u);  // A bijection.
          continue;
        }
        const double d = counts[x * n + y] - expected;
        chi2 += d * d / expected;
      }
    }
    const double df = static_cast<double>(cells - 1);
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << "n=" << n;
    EXPECT_GT(chi2, df - 6 * std::sqrt(2 * df)) << "n=" << n << ": too even to be random";
  }
}

// Whole orders of the smallest groups: over 48000 passes, how often each of the n! orders of
// n = 3 and 4 (b = 2: halves of one bit) comes up, against what the network's 12 rounds give
// with truly random round functions: there, each round is one of four permutations of [0, 4)
// ((a, b) -> (b, a xor f(b)), f one of the four functions of one bit), equally likely and
// independent, so the network's distribution over the 24 permutations of [0, 4) is the 12-fold
// convolution of one round's, computed exactly here, and the cycle walk maps each permutation
// to an order of [0, n). (With 6 rounds that distribution is itself 0.94 to 1.03 times uniform:
// the structure's bias, whatever the round function.) So this checks that the keyed Mix32 acts
// as a random function would, by a chi-square (n! - 1 degrees of freedom, 6 standard
// deviations, fixed seed).
TEST(PassOrderTest, OrdersOfTinyGroupsAreThoseOfRandomRoundFunctions) {
  // Orders of [0, k) as vectors, ranked by their Lehmer code.
  const auto index_of = [](const std::vector<uint64_t>& order) {
    uint64_t index = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      uint64_t smaller_after = 0;
      for (size_t k = i + 1; k < order.size(); ++k) smaller_after += order[k] < order[i];
      index = index * (order.size() - i) + smaller_after;
    }
    return index;
  };
  std::vector<std::vector<uint64_t>> perms;  // The 24 permutations of [0, 4), by rank.
  std::vector<uint64_t> p = {0, 1, 2, 3};
  do perms.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  // One round with f given by the two bits of g: x = 2a + b -> 2b + (a xor f(b)).
  std::vector<double> network(24, 0);
  network[0] = 1;  // The identity, before any round.
  for (int r = 0; r < 12; ++r) {
    std::vector<double> next(24, 0);
    for (uint64_t g = 0; g < 4; ++g) {
      std::vector<uint64_t> round(4);
      for (uint64_t x = 0; x < 4; ++x) {
        const uint64_t a = x >> 1, b = x & 1;
        round[x] = 2 * b + (a ^ ((g >> b) & 1));
      }
      for (uint64_t i = 0; i < 24; ++i) {
        std::vector<uint64_t> composed(4);
        for (uint64_t x = 0; x < 4; ++x) composed[x] = round[perms[i][x]];
        next[index_of(composed)] += network[i] / 4;
      }
    }
    network = next;
  }
  for (uint64_t n : {uint64_t{3}, uint64_t{4}}) {
    const uint64_t orders = n == 3 ? 6 : 24;
    std::vector<double> ideal(orders, 0);
    for (uint64_t i = 0; i < 24; ++i) {
      std::vector<uint64_t> order(n);
      for (uint64_t j = 0; j < n; ++j) {
        uint64_t x = perms[i][j];
        while (x >= n) x = perms[i][x];
        order[j] = x;
      }
      ideal[index_of(order)] += network[i];
    }
    constexpr uint64_t kPasses = 48000;
    std::vector<uint64_t> counts(orders, 0);
    for (uint64_t pass = 0; pass < kPasses; ++pass) {
      const PassOrder order(MakePassKey(4242, 3, pass), n);
      std::vector<uint64_t> got(n);
      for (uint64_t j = 0; j < n; ++j) got[j] = order.At(j);
      ++counts[index_of(got)];
    }
    double chi2 = 0;
    for (uint64_t i = 0; i < orders; ++i) {
      const double expected = ideal[i] * kPasses;
      ASSERT_GT(expected, 0) << "n=" << n << " order " << i;
      chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    const double df = static_cast<double>(orders - 1);
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << "n=" << n;
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
