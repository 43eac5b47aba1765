// Philox4x32-10 for many counters at once: the CPU backend's bulk random numbers.
//
// Each function returns exactly what kernels/philox.h computes for every counter: Philox is
// integer arithmetic, so the SIMD versions (AVX-512, AVX2) are bit-identical to the scalar one;
// the implementation is picked once at run time from the CPU's features. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_PHILOX_BATCH_H_
#define SAMPLERD_KERNELS_INTERNAL_PHILOX_BATCH_H_

#include <cstdint>

#include "kernels/internal/simd_level.h"
#include "kernels/philox.h"

namespace samplerd {
namespace internal {

// out[k] = RandomBits64(seed, epoch, stream, first + k) for k in [0, count).
void RandomBits64Range(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
                       uint64_t count, uint64_t* out);

// All four 32-bit words of every counter: out[4k + j] = RandomBlock(seed, epoch, stream,
// first + k).v[j] for k in [0, count), j in [0, 4). `out` holds 4 * count words.
void RandomWords32Range(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
                        uint64_t count, uint32_t* out);

// The same with an explicit implementation (tests compare them). `level` must be supported by
// the CPU (<= BestSimdLevel()).
void RandomBits64RangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                           uint64_t first, uint64_t count, uint64_t* out);
void RandomWords32RangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                            uint64_t first, uint64_t count, uint32_t* out);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_PHILOX_BATCH_H_
