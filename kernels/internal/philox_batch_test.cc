#include "kernels/internal/philox_batch.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace internal {
namespace {

TEST(PhiloxBatchTest, RangeEqualsScalarPhilox) {
  const uint64_t seed = 0xfedcba9876543210ull, epoch = 0x1234567890ull;
  // Starts where the low counter word wraps into the high one, and odd lengths for the tails.
  for (uint64_t first : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 9,
                         uint64_t{123456789012345}, ~uint64_t{0} - 100}) {
    for (uint64_t count : {0, 1, 7, 8, 15, 16, 17, 37, 100}) {
      for (SimdLevel level : SupportedSimdLevels()) {
        std::vector<uint64_t> out(count + 1, 42);
        RandomBits64RangeWith(level, seed, epoch, RandomStream::kShuffle, first, count, out.data());
        for (uint64_t k = 0; k < count; ++k) {
          ASSERT_EQ(out[k], RandomBits64(seed, epoch, RandomStream::kShuffle, first + k))
              << "level " << static_cast<int>(level) << " first " << first << " k " << k;
        }
        EXPECT_EQ(out[count], 42u) << "wrote past the end";
      }
    }
  }
}

TEST(PhiloxBatchTest, Words32EqualsScalarPhilox) {
  const uint64_t seed = 0x0123456789abcdefull, epoch = 77;
  for (uint64_t first : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 32) - 5, ~uint64_t{0} - 40}) {
    for (uint64_t count : {0, 1, 3, 4, 8, 15, 16, 17, 33}) {
      for (SimdLevel level : SupportedSimdLevels()) {
        std::vector<uint32_t> out(4 * count + 1, 42);
        RandomWords32RangeWith(level, seed, epoch, RandomStream::kShuffleSwap, first, count,
                               out.data());
        for (uint64_t k = 0; k < count; ++k) {
          const Philox4x32Counter want =
              RandomBlock(seed, epoch, RandomStream::kShuffleSwap, first + k);
          for (int j = 0; j < 4; ++j) {
            ASSERT_EQ(out[4 * k + j], want.v[j]) << "level " << static_cast<int>(level) << " first "
                                                 << first << " k " << k << " j " << j;
          }
        }
        EXPECT_EQ(out[4 * count], 42u) << "wrote past the end";
      }
    }
  }
}

TEST(PhiloxBatchTest, DefaultUsesTheBestLevel) {
  std::vector<uint64_t> a(50), b(50);
  RandomBits64Range(1, 2, RandomStream::kDraw, 1000, 50, a.data());
  RandomBits64RangeWith(SimdLevel::kScalar, 1, 2, RandomStream::kDraw, 1000, 50, b.data());
  EXPECT_EQ(a, b);
  std::vector<uint32_t> c(200), d(200);
  RandomWords32Range(1, 2, RandomStream::kShuffle, 1000, 50, c.data());
  RandomWords32RangeWith(SimdLevel::kScalar, 1, 2, RandomStream::kShuffle, 1000, 50, d.data());
  EXPECT_EQ(c, d);
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
