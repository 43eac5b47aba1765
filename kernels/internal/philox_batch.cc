#include "kernels/internal/philox_batch.h"

#include <immintrin.h>

namespace samplerd {
namespace internal {
namespace {

// Where the positions of a batch come from.
struct RangeSource {
  uint64_t first;
  uint64_t At(uint64_t k) const { return first + k; }
};
template <typename T>
struct GatherSource {
  const T* positions;
  uint64_t At(uint64_t k) const { return positions[k]; }
};

template <typename Source>
void Scalar(uint64_t seed, uint64_t epoch, RandomStream stream, const Source& source,
            uint64_t begin, uint64_t count, uint64_t* out) {
  for (uint64_t k = begin; k < count; ++k) out[k] = RandomBits64(seed, epoch, stream, source.At(k));
}

// ---- AVX-512: 8 counters per vector, one per 64-bit lane -----------------------------------
// Each Philox word sits in the low half of a 64-bit lane; vpmuludq multiplies the low halves
// into a full 64-bit product (hi in the upper half, lo in the lower), and the garbage the XORs
// leave in the upper halves is never read by the next multiply. The last step packs
// (word1 << 32) | word0, which is RandomBits64.

SAMPLERD_TARGET_AVX512 inline __m512i Positions512(const RangeSource& s, uint64_t k) {
  return _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(s.first + k)),
                          _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
}
SAMPLERD_TARGET_AVX512 inline __m512i Positions512(const GatherSource<uint32_t>& s, uint64_t k) {
  return _mm512_cvtepu32_epi64(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.positions + k)));
}
SAMPLERD_TARGET_AVX512 inline __m512i Positions512(const GatherSource<uint64_t>& s, uint64_t k) {
  return _mm512_loadu_si512(s.positions + k);
}

template <typename Source>
SAMPLERD_TARGET_AVX512 void Avx512(uint64_t seed, uint64_t epoch, RandomStream stream,
                                   const Source& source, uint64_t count, uint64_t* out) {
  constexpr int kVectors = 2;  // Two independent vectors hide the multiply latency.
  constexpr uint64_t kStep = 8 * kVectors;
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53u);
  const __m512i m1 = _mm512_set1_epi64(0xCD9E8D57u);
  const __m512i low32 = _mm512_set1_epi64(0xffffffffu);
  const __m512i word2 = _mm512_set1_epi64(static_cast<uint32_t>(epoch));
  const __m512i word3 = _mm512_set1_epi64(static_cast<uint32_t>(stream));
  uint64_t k = 0;
  for (; k + kStep <= count; k += kStep) {
    __m512i c0[kVectors], c1[kVectors], c2[kVectors], c3[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      const __m512i i = Positions512(source, k + 8 * v);
      c0[v] = i;
      c1[v] = _mm512_srli_epi64(i, 32);
      c2[v] = word2;
      c3[v] = word3;
    }
    uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i k0 = _mm512_set1_epi64(key0), k1 = _mm512_set1_epi64(key1);
      for (int v = 0; v < kVectors; ++v) {
        const __m512i p0 = _mm512_mul_epu32(c0[v], m0);
        const __m512i p1 = _mm512_mul_epu32(c2[v], m1);
        // 0x96: three-way XOR.
        c0[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[v], k0, 0x96);
        c2[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[v], k1, 0x96);
        c1[v] = p1;
        c3[v] = p0;
      }
      key0 += 0x9E3779B9u;
      key1 += 0xBB67AE85u;
    }
    for (int v = 0; v < kVectors; ++v) {
      // 0xF8: A | (B & C) = (c1 << 32) | (c0 & 0xffffffff).
      _mm512_storeu_si512(out + k + 8 * v, _mm512_ternarylogic_epi64(_mm512_slli_epi64(c1[v], 32),
                                                                     c0[v], low32, 0xF8));
    }
  }
  Scalar(seed, epoch, stream, source, k, count, out);
}

// ---- AVX2: 4 counters per vector, the same lane layout -------------------------------------

SAMPLERD_TARGET_AVX2 inline __m256i Positions256(const RangeSource& s, uint64_t k) {
  return _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(s.first + k)),
                          _mm256_setr_epi64x(0, 1, 2, 3));
}
SAMPLERD_TARGET_AVX2 inline __m256i Positions256(const GatherSource<uint32_t>& s, uint64_t k) {
  return _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.positions + k)));
}
SAMPLERD_TARGET_AVX2 inline __m256i Positions256(const GatherSource<uint64_t>& s, uint64_t k) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.positions + k));
}

template <typename Source>
SAMPLERD_TARGET_AVX2 void Avx2(uint64_t seed, uint64_t epoch, RandomStream stream,
                               const Source& source, uint64_t count, uint64_t* out) {
  constexpr int kVectors = 2;
  constexpr uint64_t kStep = 4 * kVectors;
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u);
  const __m256i m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  const __m256i low32 = _mm256_set1_epi64x(0xffffffffu);
  const __m256i word2 = _mm256_set1_epi64x(static_cast<uint32_t>(epoch));
  const __m256i word3 = _mm256_set1_epi64x(static_cast<uint32_t>(stream));
  uint64_t k = 0;
  for (; k + kStep <= count; k += kStep) {
    __m256i c0[kVectors], c1[kVectors], c2[kVectors], c3[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      const __m256i i = Positions256(source, k + 4 * v);
      c0[v] = i;
      c1[v] = _mm256_srli_epi64(i, 32);
      c2[v] = word2;
      c3[v] = word3;
    }
    uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i k0 = _mm256_set1_epi64x(key0), k1 = _mm256_set1_epi64x(key1);
      for (int v = 0; v < kVectors; ++v) {
        const __m256i p0 = _mm256_mul_epu32(c0[v], m0);
        const __m256i p1 = _mm256_mul_epu32(c2[v], m1);
        c0[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[v]), k0);
        c2[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[v]), k1);
        c1[v] = p1;
        c3[v] = p0;
      }
      key0 += 0x9E3779B9u;
      key1 += 0xBB67AE85u;
    }
    for (int v = 0; v < kVectors; ++v) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + k + 4 * v),
          _mm256_or_si256(_mm256_slli_epi64(c1[v], 32), _mm256_and_si256(c0[v], low32)));
    }
  }
  Scalar(seed, epoch, stream, source, k, count, out);
}

template <typename Source>
void Run(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream, const Source& source,
         uint64_t count, uint64_t* out) {
  switch (level) {
    case SimdLevel::kAvx512:
      return Avx512(seed, epoch, stream, source, count, out);
    case SimdLevel::kAvx2:
      return Avx2(seed, epoch, stream, source, count, out);
    case SimdLevel::kScalar:
      break;
  }
  Scalar(seed, epoch, stream, source, 0, count, out);
}

}  // namespace

void RandomBits64RangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                           uint64_t first, uint64_t count, uint64_t* out) {
  Run(level, seed, epoch, stream, RangeSource{first}, count, out);
}
void RandomBits64GatherWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                            const uint32_t* positions, uint64_t count, uint64_t* out) {
  Run(level, seed, epoch, stream, GatherSource<uint32_t>{positions}, count, out);
}
void RandomBits64GatherWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                            const uint64_t* positions, uint64_t count, uint64_t* out) {
  Run(level, seed, epoch, stream, GatherSource<uint64_t>{positions}, count, out);
}

void RandomBits64Range(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
                       uint64_t count, uint64_t* out) {
  RandomBits64RangeWith(BestSimdLevel(), seed, epoch, stream, first, count, out);
}
void RandomBits64Gather(uint64_t seed, uint64_t epoch, RandomStream stream,
                        const uint32_t* positions, uint64_t count, uint64_t* out) {
  RandomBits64GatherWith(BestSimdLevel(), seed, epoch, stream, positions, count, out);
}
void RandomBits64Gather(uint64_t seed, uint64_t epoch, RandomStream stream,
                        const uint64_t* positions, uint64_t count, uint64_t* out) {
  RandomBits64GatherWith(BestSimdLevel(), seed, epoch, stream, positions, count, out);
}

}  // namespace internal
}  // namespace samplerd
