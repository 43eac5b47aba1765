// Weighted selection without replacement: Efraimidis-Spirakis exponential keys.
//
// Definition (what every backend must return): sample i gets the key
//   key_i = -Log2(UniformOpen01(RandomBits64(seed, epoch, kEsKey, i))) / w_i
// (det::Log2, IEEE division; +inf when w_i <= 0, so never selected), compared through its IEEE
// bit pattern as a uint64 (keys are positive doubles, whose bits order like the values). The
// selected samples are the M smallest keys, ties broken by the smaller index. Sample i is then
// in the selection with the probability of successive weighted draws without replacement.
// Results do not depend on `threads`. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_ES_SELECT_H_
#define SAMPLERD_KERNELS_INTERNAL_ES_SELECT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/internal/simd_level.h"

namespace samplerd {
namespace internal {

// keys[k] = plan_math::EsKeyBits(seed, epoch, first + k, weights[k]) (kernels/plan_math.h: key_i's
// bits, one at a time, the definition) for k < count, vectorised where the
// CPU allows (bit-identical: the same IEEE operations in the same order, no FMA).
// weights == nullptr: all weights 1.
void EsKeyBitsRange(uint64_t seed, uint64_t epoch, uint64_t first, uint64_t count,
                    const float* weights, uint64_t* keys);
// The same with an explicit SIMD version (tests compare them); `level` <= BestSimdLevel().
void EsKeyBitsRangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, uint64_t first,
                        uint64_t count, const float* weights, uint64_t* keys);

// The indices of the m smallest keys of samples [0, n) (ties by the smaller index), in
// increasing index order. weights: n entries, or empty for all 1. Requires 1 <= m <= the number
// of positive weights (so m <= n).
//
// How: the keys and a histogram of their top 16 bits in one parallel pass; the digit of the m-th
// smallest key then splits the samples into selected (a smaller digit), candidates (that digit:
// a few percent of n) and the rest in a second pass; the candidates are finished by
// nth_element. Memory: the n keys (8 bytes each) while it runs, the candidates, the result.
std::vector<uint64_t> SelectEfraimidisSpirakis(int threads, uint64_t seed, uint64_t epoch,
                                               uint64_t n, uint64_t m,
                                               absl::Span<const float> weights);

// Bytes that SelectEfraimidisSpirakis(threads, ..., n, m, ...) allocates at its peak, result
// included, as a bound: about 9 per sample plus 9 per selected sample while the keys live, or
// 2 per sample plus 17 per selected sample while the lists are merged, whichever is larger.
uint64_t SelectScratchBytes(int threads, uint64_t n, uint64_t m);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_ES_SELECT_H_
