#include "kernels/philox.h"

#include "gtest/gtest.h"

namespace samplerd {
namespace {

// Random123 kat_vectors, philox4x32 10: counter[4] key[2] -> output[4].
struct Kat {
  Philox4x32Counter ctr;
  Philox4x32Key key;
  uint32_t expected[4];
};

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) {
    const Philox4x32Counter out = Philox4x32_10(kat.ctr, kat.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], kat.expected[i]) << "word " << i;
  }
}

TEST(PhiloxTest, StreamsEpochsAndPositionsAreIndependent) {
  const uint64_t a = RandomBits64(7, 0, RandomStream::kDraw, 5);
  EXPECT_EQ(a, RandomBits64(7, 0, RandomStream::kDraw, 5));
  EXPECT_NE(a, RandomBits64(7, 1, RandomStream::kDraw, 5));
  EXPECT_NE(a, RandomBits64(7, 0, RandomStream::kShuffle, 5));
  EXPECT_NE(a, RandomBits64(7, 0, RandomStream::kDraw, 6));
  EXPECT_NE(a, RandomBits64(8, 0, RandomStream::kDraw, 5));
  // The high word of the position matters (N > 2^32).
  EXPECT_NE(RandomBits64(7, 0, RandomStream::kDraw, 1),
            RandomBits64(7, 0, RandomStream::kDraw, (uint64_t{1} << 32) + 1));
}

TEST(PhiloxTest, MulHi64MapsIntoRange) {
  EXPECT_EQ(MulHi64(0, 10), 0u);
  EXPECT_EQ(MulHi64(~uint64_t{0}, 10), 9u);
  EXPECT_EQ(MulHi64(uint64_t{1} << 63, 10), 5u);
  EXPECT_EQ(MulHi64(~uint64_t{0}, uint64_t{5} << 32), (uint64_t{5} << 32) - 1);
}

}  // namespace
}  // namespace samplerd
