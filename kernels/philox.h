// Philox4x32-10 counter-based random number generator (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11), the same code on host and device.
//
// samplerd derives every random number from (seed, epoch, position, stream): no generator
// state, so any rank, thread or GPU thread computes draw j on its own and gets the same value.
// Checked against the Random123 known-answer vectors in philox_test.cc.
#ifndef SAMPLERD_KERNELS_PHILOX_H_
#define SAMPLERD_KERNELS_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SAMPLERD_HD __host__ __device__ __forceinline__
#else
#define SAMPLERD_HD inline
#endif

namespace samplerd {

struct Philox4x32Counter {
  uint32_t v[4];
};
struct Philox4x32Key {
  uint32_t v[2];
};

namespace philox_internal {
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // Golden ratio.
constexpr uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1.

SAMPLERD_HD void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}
}  // namespace philox_internal

// The 10-round Philox4x32 bijection of `ctr` under `key`.
SAMPLERD_HD Philox4x32Counter Philox4x32_10(Philox4x32Counter ctr, Philox4x32Key key) {
  using namespace philox_internal;  // NOLINT: constants of this file.
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kM0, ctr.v[0], &hi0, &lo0);
    MulHiLo(kM1, ctr.v[2], &hi1, &lo1);
    ctr = {{hi1 ^ ctr.v[1] ^ key.v[0], lo1, hi0 ^ ctr.v[3] ^ key.v[1], lo0}};
    key.v[0] += kW0;
    key.v[1] += kW1;
  }
  return ctr;
}

// Independent random streams of one job: two uses never share a counter.
enum class RandomStream : uint32_t {
  kEsKey = 1,        // Efraimidis-Spirakis keys (without replacement, M < N).
  kShuffle = 2,      // Buckets of the uniform shuffle.
  kDraw = 3,         // Draws with replacement.
  kShuffleSwap = 4,  // Swaps of the uniform shuffle inside a bucket.
  kPassOrder = 5,    // Round keys 0-3 of the mixture jobs' pass orders (mixture/pass_order.h),
  kPassOrder2 = 6,   // their round keys 4-7,
  kPassOrder3 = 7,   // and 8-11.
};

// The Philox block of counter `i` of `stream` in `epoch` of the job seeded with `seed`:
// key = seed; counter = (i low, i high, epoch low, stream). 128 random bits.
SAMPLERD_HD Philox4x32Counter RandomBlock(uint64_t seed, uint64_t epoch, RandomStream stream,
                                          uint64_t i) {
  return Philox4x32_10({{static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32),
                         static_cast<uint32_t>(epoch), static_cast<uint32_t>(stream)}},
                       {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
}

// 64 random bits for position `i`: words 1 and 0 of RandomBlock, word1 << 32 | word0.
SAMPLERD_HD uint64_t RandomBits64(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t i) {
  const Philox4x32Counter out = RandomBlock(seed, epoch, stream, i);
  return (static_cast<uint64_t>(out.v[1]) << 32) | out.v[0];
}

// floor(r * n / 2^64): maps 64 random bits to [0, n) (Lemire's multiply-high, no division).
SAMPLERD_HD uint64_t MulHi64(uint64_t r, uint64_t n) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(r, n);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
#endif
}

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_PHILOX_H_
