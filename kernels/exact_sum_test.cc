// The exact sum (exact_sum.h): its definition computed independently (ldexp, floor and the
// compiler's 128-bit conversion), independence from the order of additions, rounding, accuracy.
#include "kernels/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace exact_sum {
namespace {

// The definition, written with the C library instead of bit manipulation.
double ReferenceSum(const std::vector<double>& x) {
  auto eb = [](double v) {
    if (v == 0) return 1;
    int e;
    std::frexp(v, &e);  // v = f 2^e, f in [0.5, 1): biased exponent e + 1022 (normal v).
    return std::max(1, e + 1022);
  };
  struct Chunk {
    int exponent;
    uint128 sum;
  };
  std::vector<Chunk> chunks;
  for (size_t b = 0; b < x.size(); b += kChunk) {
    const size_t e = std::min(x.size(), b + kChunk);
    int exponent = 1;
    for (size_t i = b; i < e; ++i) exponent = std::max(exponent, eb(x[i]));
    uint128 sum = 0;
    for (size_t i = b; i < e; ++i) {
      sum += static_cast<uint64_t>(std::floor(std::ldexp(x[i], 1085 - exponent)));
    }
    chunks.push_back({exponent, sum});
  }
  int top = 1;
  for (const Chunk& c : chunks) top = std::max(top, c.exponent);
  uint128 t = 0;
  for (const Chunk& c : chunks) {
    const int shift = top - c.exponent;
    t += shift < 128 ? c.sum >> shift : 0;
  }
  return std::ldexp(static_cast<double>(t), top - 1085);  // libgcc's rounding, ties to even.
}

std::vector<ChunkSum> Chunks(const std::vector<double>& x) {
  std::vector<ChunkSum> chunks;
  for (size_t b = 0; b < x.size(); b += kChunk) {
    chunks.push_back(SumChunk(x.data() + b, std::min<size_t>(kChunk, x.size() - b)));
  }
  return chunks;
}

double Sum(const std::vector<double>& x) {
  const std::vector<ChunkSum> chunks = Chunks(x);
  return Total(chunks.data(), chunks.size());
}

// Terms over a wide range of magnitudes (including 0, -0, subnormals and ties of exponents).
std::vector<double> WideTerms(size_t n, uint32_t seed, int max_exponent) {
  std::mt19937_64 rng(seed);
  std::vector<double> x(n);
  for (double& v : x) {
    const uint64_t r = rng();
    switch (r % 8) {
      case 0:
        v = 0.0;
        break;
      case 1:
        v = -0.0;
        break;
      case 2:
        v = std::ldexp(static_cast<double>(r >> 40), -1074);  // Subnormal.
        break;
      default:
        v = std::ldexp(static_cast<double>(r >> 11) / 9007199254740992.0 + 0.5,
                       static_cast<int>(rng() % (2 * max_exponent + 1)) - max_exponent);
    }
  }
  return x;
}

TEST(ExactSumTest, SmallSumsAreExact) {
  EXPECT_EQ(Sum({1, 2, 3}), 6.0);
  EXPECT_EQ(Sum({0.5, 0.25, 0.125}), 0.875);
  EXPECT_EQ(Sum({0, -0.0, 0}), 0.0);
  EXPECT_EQ(Sum({3.0}), 3.0);
  EXPECT_EQ(Sum(std::vector<double>(100'000, 1.0)), 100'000.0);
  // 10000 times double(0.1) is 1000.0000000000000555: the nearest double is 1000 (a double sum
  // in index order gives 1000.0000000001588).
  EXPECT_EQ(Sum(std::vector<double>(10'000, 0.1)), 1000.0);
}

TEST(ExactSumTest, MatchesTheDefinitionComputedWithTheCLibrary) {
  for (size_t n : {1, 2, 4095, 4096, 4097, 20'000, 70'001}) {
    for (int max_exponent : {3, 60, 900}) {
      const std::vector<double> x =
          WideTerms(n, static_cast<uint32_t>(n + max_exponent), max_exponent);
      EXPECT_EQ(Sum(x), ReferenceSum(x)) << "n " << n << ", exponents up to " << max_exponent;
    }
  }
}

TEST(ExactSumTest, OrderOfAdditionsDoesNotMatter) {
  std::vector<double> x = WideTerms(50'000, 7, 40);
  const double want = Sum(x);
  std::mt19937_64 rng(8);
  // Any order inside each chunk.
  for (size_t b = 0; b < x.size(); b += kChunk) {
    std::shuffle(x.begin() + b, x.begin() + std::min(x.size(), b + kChunk), rng);
  }
  EXPECT_EQ(Sum(x), want);
  // Any order of the chunks' results.
  std::vector<ChunkSum> chunks = Chunks(x);
  std::reverse(chunks.begin(), chunks.end());
  EXPECT_EQ(Total(chunks.data(), chunks.size()), want);
  // Any order of the integer additions within a chunk (a tree, as a GPU block adds).
  const ChunkSum one = SumChunk(x.data(), kChunk);
  uint128 tree[kChunk];
  for (uint64_t i = 0; i < kChunk; ++i) tree[i] = Quantise(TermBits(x[i]), one.exponent);
  for (uint64_t width = kChunk / 2; width > 0; width /= 2) {
    for (uint64_t i = 0; i < width; ++i) tree[i] += tree[i + width];
  }
  EXPECT_TRUE(tree[0] == one.sum);
}

TEST(ExactSumTest, ChunkBoundariesArePartOfTheDefinition) {
  // A term tiny next to its chunk's largest vanishes; in a chunk of its own it counts.
  std::vector<double> x(kChunk + 1, 0.0);
  x[0] = 0x1p100;
  x[1] = 1.0;  // 2^-100 of its chunk's largest: below the chunk's 63 bits.
  EXPECT_EQ(Sum(x), 0x1p100);
  x[1] = 0.0;
  x[kChunk] = 1.0;  // Alone in chunk 1, then shifted by 100 bits against chunk 0: gone too.
  EXPECT_EQ(Sum(x), 0x1p100);
  x[0] = 0x1p40;  // Within the 63 bits: kept exactly.
  EXPECT_EQ(Sum(x), 0x1p40 + 1.0);
}

TEST(ExactSumTest, PositiveWhenAnyTermIsPositive) {
  for (double tiny : {0x1p-1074, 0x1p-1022, 1e-300}) {
    std::vector<double> x(9000, 0.0);
    x[8999] = tiny;
    EXPECT_GT(Sum(x), 0.0) << tiny;
    EXPECT_EQ(Sum(x), tiny) << tiny;
  }
}

TEST(ExactSumTest, RelativeErrorBelowNTimes2ToTheMinus61) {
  for (int max_exponent : {2, 30}) {
    const std::vector<double> x = WideTerms(200'000, 11 + max_exponent, max_exponent);
    long double exact = 0;  // 64-bit significand: its own error is far below the bound.
    for (double v : x) exact += v;
    const double got = Sum(x);
    EXPECT_LE(got, static_cast<double>(exact) * (1 + 0x1p-52));
    EXPECT_LE(std::fabs(static_cast<long double>(got) - exact) / exact, x.size() * 0x1p-61L);
  }
}

TEST(ExactSumTest, RoundToDoubleIsNearestTiesToEven) {
  const uint128 two64 = uint128{1} << 64;
  // Doubles at 2^64 are 2^12 apart: 2^11 above is a tie, rounded to the even neighbour.
  EXPECT_EQ(RoundToDouble(two64 + (1 << 11)), 0x1p64);
  EXPECT_EQ(RoundToDouble(two64 + 3 * (1 << 11)), 0x1p64 + 0x1p13);
  EXPECT_EQ(RoundToDouble(two64 + (1 << 11) + 1), 0x1p64 + 0x1p12);  // Sticky bit decides.
  EXPECT_EQ(RoundToDouble((two64 << 30) + (uint128{1} << 41) + 1), 0x1p94 + 0x1p42);
  EXPECT_EQ(RoundToDouble(~uint128{0}), 0x1p128);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100'000; ++i) {
    const uint128 t = (static_cast<uint128>(rng() >> (rng() % 64)) << 64) | rng();
    ASSERT_EQ(RoundToDouble(t), static_cast<double>(t)) << i;  // libgcc's conversion.
  }
}

}  // namespace
}  // namespace exact_sum
}  // namespace samplerd
