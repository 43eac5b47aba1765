#include "kernels/internal/philox_batch.h"

#include <immintrin.h>

#include <cstring>

namespace samplerd {
namespace internal {
namespace {

// What a batch stores per counter: 64 bits (words 1:0, RandomBits64) or all 128 (words 0..3).
enum class Output { kBits64, kWords32 };

void Scalar(Output output, uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
            uint64_t begin, uint64_t count, void* out) {
  for (uint64_t k = begin; k < count; ++k) {
    if (output == Output::kBits64) {
      static_cast<uint64_t*>(out)[k] = RandomBits64(seed, epoch, stream, first + k);
    } else {
      const Philox4x32Counter block = RandomBlock(seed, epoch, stream, first + k);
      std::memcpy(static_cast<uint32_t*>(out) + 4 * k, block.v, sizeof block.v);
    }
  }
}

// Stores lanes [0, lanes) of the packed words 1:0 (`low`) and 3:2 (`high`) of counters
// k, k + 1, ...: out[4 (k + l) + j] = word j of lane l, in memory order (little-endian x86).
inline void StoreWords32(const uint64_t* low, const uint64_t* high, int lanes, uint64_t k,
                         uint32_t* out) {
  for (int l = 0; l < lanes; ++l) {
    std::memcpy(out + 4 * (k + l), &low[l], 8);
    std::memcpy(out + 4 * (k + l) + 2, &high[l], 8);
  }
}

// ---- AVX-512: 8 counters per vector, one per 64-bit lane -----------------------------------
// Each Philox word sits in the low half of a 64-bit lane; vpmuludq multiplies the low halves
// into a full 64-bit product (hi in the upper half, lo in the lower), and the garbage the XORs
// leave in the upper halves is never read by the next multiply. The last step packs
// (word1 << 32) | word0, which is RandomBits64 (and (word3 << 32) | word2 for all 128 bits).

SAMPLERD_TARGET_AVX512 void Avx512(Output output, uint64_t seed, uint64_t epoch,
                                   RandomStream stream, uint64_t first, uint64_t count, void* out) {
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
      const __m512i i =
          _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first + k + 8 * v)),
                           _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
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
      const __m512i low =
          _mm512_ternarylogic_epi64(_mm512_slli_epi64(c1[v], 32), c0[v], low32, 0xF8);
      if (output == Output::kBits64) {
        _mm512_storeu_si512(static_cast<uint64_t*>(out) + k + 8 * v, low);
      } else {
        alignas(64) uint64_t low_lanes[8], high_lanes[8];
        _mm512_store_si512(low_lanes, low);
        _mm512_store_si512(high_lanes, _mm512_ternarylogic_epi64(_mm512_slli_epi64(c3[v], 32),
                                                                 c2[v], low32, 0xF8));
        StoreWords32(low_lanes, high_lanes, 8, k + 8 * v, static_cast<uint32_t*>(out));
      }
    }
  }
  Scalar(output, seed, epoch, stream, first, k, count, out);
}

// ---- AVX2: 4 counters per vector, the same lane layout -------------------------------------

SAMPLERD_TARGET_AVX2 void Avx2(Output output, uint64_t seed, uint64_t epoch, RandomStream stream,
                               uint64_t first, uint64_t count, void* out) {
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
      const __m256i i =
          _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + k + 4 * v)),
                           _mm256_setr_epi64x(0, 1, 2, 3));
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
      const __m256i low =
          _mm256_or_si256(_mm256_slli_epi64(c1[v], 32), _mm256_and_si256(c0[v], low32));
      if (output == Output::kBits64) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint64_t*>(out) + k + 4 * v),
                            low);
      } else {
        alignas(32) uint64_t low_lanes[4], high_lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(low_lanes), low);
        _mm256_store_si256(
            reinterpret_cast<__m256i*>(high_lanes),
            _mm256_or_si256(_mm256_slli_epi64(c3[v], 32), _mm256_and_si256(c2[v], low32)));
        StoreWords32(low_lanes, high_lanes, 4, k + 4 * v, static_cast<uint32_t*>(out));
      }
    }
  }
  Scalar(output, seed, epoch, stream, first, k, count, out);
}

void Run(SimdLevel level, Output output, uint64_t seed, uint64_t epoch, RandomStream stream,
         uint64_t first, uint64_t count, void* out) {
  switch (level) {
    case SimdLevel::kAvx512:
      return Avx512(output, seed, epoch, stream, first, count, out);
    case SimdLevel::kAvx2:
      return Avx2(output, seed, epoch, stream, first, count, out);
    case SimdLevel::kScalar:
      break;
  }
  Scalar(output, seed, epoch, stream, first, 0, count, out);
}

}  // namespace

void RandomBits64RangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                           uint64_t first, uint64_t count, uint64_t* out) {
  Run(level, Output::kBits64, seed, epoch, stream, first, count, out);
}
void RandomWords32RangeWith(SimdLevel level, uint64_t seed, uint64_t epoch, RandomStream stream,
                            uint64_t first, uint64_t count, uint32_t* out) {
  Run(level, Output::kWords32, seed, epoch, stream, first, count, out);
}

void RandomBits64Range(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
                       uint64_t count, uint64_t* out) {
  RandomBits64RangeWith(BestSimdLevel(), seed, epoch, stream, first, count, out);
}
void RandomWords32Range(uint64_t seed, uint64_t epoch, RandomStream stream, uint64_t first,
                        uint64_t count, uint32_t* out) {
  RandomWords32RangeWith(BestSimdLevel(), seed, epoch, stream, first, count, out);
}

}  // namespace internal
}  // namespace samplerd
