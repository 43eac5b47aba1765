#include "kernels/large_array.h"

#include <cstdint>
#include <new>
#include <numeric>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(LargeVectorTest, LargeArraysAreHugePageAligned) {
  LargeVector<uint32_t> v(5'000'000);  // 20 MB.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (uintptr_t{2} << 20), 0u);
  LargeVector<uint64_t> small(10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % alignof(uint64_t), 0u);
}

TEST(LargeVectorTest, BehavesLikeAVector) {
  LargeVector<uint64_t> v(3'000'000);
  std::iota(v.begin(), v.end(), uint64_t{7});
  LargeVector<uint64_t> copy = v;
  EXPECT_EQ(copy, v);
  copy.push_back(1);
  EXPECT_EQ(copy.size(), v.size() + 1);
  EXPECT_EQ(copy[2'999'999], 7u + 2'999'999u);
  LargeVector<float> filled(1000, 2.5f);  // Explicit values are still written.
  for (float x : filled) ASSERT_EQ(x, 2.5f);
  v = LargeVector<uint64_t>();
  EXPECT_TRUE(v.empty());
}

TEST(LargeVectorTest, ImpossibleSizesThrowBadAlloc) {
  LargeArrayAllocator<uint64_t> allocator;
  EXPECT_THROW(allocator.allocate(~size_t{0} / 4), std::bad_alloc);
  EXPECT_THROW(allocator.allocate(size_t{1} << 50), std::bad_alloc);  // 8 PiB.
}

}  // namespace
}  // namespace samplerd
