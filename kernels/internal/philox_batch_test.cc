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

TEST(PhiloxBatchTest, GatherEqualsScalarPhilox) {
  std::vector<uint64_t> pos64;
  uint64_t s = 99;
  for (int k = 0; k < 203; ++k) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    pos64.push_back(k % 3 == 0 ? s : s >> 32);  // Some beyond 2^32, some below.
  }
  std::vector<uint32_t> pos32(pos64.size());
  for (size_t k = 0; k < pos64.size(); ++k) pos32[k] = static_cast<uint32_t>(pos64[k] * 7 + k);
  for (SimdLevel level : SupportedSimdLevels()) {
    std::vector<uint64_t> out(pos64.size());
    RandomBits64GatherWith(level, 7, 3, RandomStream::kDraw, pos64.data(), pos64.size(),
                           out.data());
    for (size_t k = 0; k < pos64.size(); ++k) {
      ASSERT_EQ(out[k], RandomBits64(7, 3, RandomStream::kDraw, pos64[k])) << k;
    }
    RandomBits64GatherWith(level, 7, 3, RandomStream::kEsKey, pos32.data(), pos32.size(),
                           out.data());
    for (size_t k = 0; k < pos32.size(); ++k) {
      ASSERT_EQ(out[k], RandomBits64(7, 3, RandomStream::kEsKey, pos32[k])) << k;
    }
  }
}

TEST(PhiloxBatchTest, DefaultUsesTheBestLevel) {
  std::vector<uint64_t> a(50), b(50);
  RandomBits64Range(1, 2, RandomStream::kDraw, 1000, 50, a.data());
  RandomBits64RangeWith(SimdLevel::kScalar, 1, 2, RandomStream::kDraw, 1000, 50, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace internal
}  // namespace samplerd
