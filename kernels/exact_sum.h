// The exact, order-independent sum that defines every mean of the weight computations
// (docs/SAMPLING.md, "Exact sums"): a block floating-point sum whose steps are integer maxima
// and integer additions, so that a GPU's tree reduction and the CPU's loops return the same bits
// whatever the order in which they combine the terms.
//
// Definition, for terms x_0, ..., x_{n-1}: finite doubles >= 0 (-0 counts as +0), below 2^900,
// n <= 2^40:
//   eb(x)  = max(1, the biased exponent of x) (bits 52-62) and m(x) = its significand as an
//            integer (the 52 fraction bits, plus 2^52 when the biased exponent is > 0), so that
//            x = m(x) 2^(eb(x) - 1075).
//   Chunks: term i belongs to chunk c = floor(i / 4096) (kChunk).
//   B_c = the largest eb(x_i) of chunk c: the chunk's exponent.
//   q_i = floor(x_i 2^(1085 - B_c)) = (m(x_i) << 10) >> (B_c - eb(x_i)), 0 when that shift is 64
//         or more: each term as an integer below 2^63 (truncated; the chunk's largest term keeps
//         at least 2^62).
//   S_c = the sum of q_i over chunk c (exact; below 2^75).
//   B   = the largest B_c;  T = the sum over all chunks of floor(S_c / 2^(B - B_c)) (exact;
//         below 2^103).
//   sum = RoundToDouble(T) 2^(B - 1085): T rounded to the nearest double, ties to even, then
//         multiplied by the power of two (exact, except that a result below 2^-1022, from
//         terms of that size only, is rounded once more to a subnormal, to nearest even).
// A GPU computes it as: one thread block per chunk (max, then integer sum of the q_i, in any
// order), then B as the maximum of the chunks' B_c and T as the integer sum of their shifted S_c
// (any order). Only the chunk boundaries are part of the definition, not the order of any
// addition.
//
// Accuracy: T 2^(B - 1085) is at most (n + n / 4096) 2^(B - 1085) below the exact sum, which is
// at least 2^(B - 1023): a relative error below n 2^-61 (double summation in index order: n
// 2^-53), before the final rounding. The sum is 0 only when every term is 0 (a chunk's largest
// term keeps at least 2^62).
//
// Header-only and free of library calls, so that the CUDA kernels compile it too. Thread-safe
// (pure functions).
#ifndef SAMPLERD_KERNELS_EXACT_SUM_H_
#define SAMPLERD_KERNELS_EXACT_SUM_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SAMPLERD_EXACT_SUM_HD __host__ __device__ inline
#else
#define SAMPLERD_EXACT_SUM_HD inline
#endif

namespace samplerd {
namespace exact_sum {

using uint128 = unsigned __int128;

inline constexpr uint64_t kChunk = 4096;  // Terms per chunk (part of the definition).
inline constexpr uint64_t kMaxTerms = uint64_t{1} << 40;  // The definition's limit on n.
inline constexpr uint64_t kSignMask = uint64_t{1} << 63;

// The bits of a term with the sign of -0 cleared (terms are >= 0).
SAMPLERD_EXACT_SUM_HD uint64_t TermBits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b & ~kSignMask;
}

// eb(x) from TermBits(x).
SAMPLERD_EXACT_SUM_HD uint32_t ExponentOfBits(uint64_t bits) {
  const uint64_t biased = bits >> 52;
  return static_cast<uint32_t>(biased | (biased == 0));
}

// B_c from the TermBits of the chunk's largest term (terms >= 0 order like their bits, so an
// integer maximum of the bits finds it).
SAMPLERD_EXACT_SUM_HD uint32_t ChunkExponent(uint64_t max_bits) { return ExponentOfBits(max_bits); }

// q_i from the TermBits of a term of a chunk of exponent `chunk_exponent` (>= the term's eb).
// In 64-bit integer operations only, without branches: the CPU's loops vectorise it.
SAMPLERD_EXACT_SUM_HD uint64_t Quantise(uint64_t bits, uint32_t chunk_exponent) {
  const uint64_t biased = bits >> 52;
  const uint64_t significand = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{biased != 0} << 52);
  const uint64_t shift = chunk_exponent - (biased | (biased == 0));
  // (significand << 10) < 2^63, so a shift by 63 already gives the 0 of shifts beyond.
  return (significand << 10) >> (shift < 63 ? shift : 63);
}

// A chunk's result: S_c in units of 2^(exponent - 1085), exponent = B_c.
struct ChunkSum {
  uint32_t exponent = 1;
  uint128 sum = 0;
};

// The nearest double to t, ties to even. Above 2^64: the top 64 bits, with a sticky bit for the
// rest, round to 53 bits exactly as t does; the conversion of a 64-bit integer rounds to nearest
// even on every IEEE machine (__ull2double_rn on a GPU).
SAMPLERD_EXACT_SUM_HD double RoundToDouble(uint128 t) {
  const uint64_t hi = static_cast<uint64_t>(t >> 64);
  if (hi == 0) return static_cast<double>(static_cast<uint64_t>(t));
  uint32_t width = 64;  // Bits of hi.
  while ((hi >> (width - 1)) == 0) --width;
  const uint64_t top = static_cast<uint64_t>(t >> width);
  const uint64_t sticky = (t & ((uint128{1} << width) - 1)) != 0;
  double scale;  // 2^width.
  const uint64_t scale_bits = static_cast<uint64_t>(1023 + width) << 52;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return static_cast<double>(top | sticky) * scale;
}

// The sum of the definition from every chunk's result (in any order).
SAMPLERD_EXACT_SUM_HD double Total(const ChunkSum* chunks, uint64_t count) {
  uint32_t exponent = 1;  // B.
  for (uint64_t c = 0; c < count; ++c) {
    if (chunks[c].exponent > exponent) exponent = chunks[c].exponent;
  }
  uint128 t = 0;
  for (uint64_t c = 0; c < count; ++c) {
    const uint32_t shift = exponent - chunks[c].exponent;
    t += shift < 128 ? chunks[c].sum >> shift : 0;
  }
  // T >= 2^62 unless every term is 0 (a chunk's largest term keeps 2^62 at least), so with
  // B >= 63 the product by 2^(B - 1085), a normal double, is a normal double: exact. Below, in
  // two normal factors 2^(B - 957) and 2^-128: the first product is exact, the second rounds the
  // subnormal result.
  const double rounded = RoundToDouble(t);
  double scale, tiny;
  const uint64_t scale_bits =
      static_cast<uint64_t>(exponent + (exponent >= 63 ? -1085 : -957) + 1023) << 52;
  const uint64_t tiny_bits = static_cast<uint64_t>(1023 - 128) << 52;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  std::memcpy(&tiny, &tiny_bits, sizeof tiny);
  return exponent >= 63 ? rounded * scale : rounded * scale * tiny;
}

// One chunk's result from its terms x[0, count), count <= kChunk (the plain loop; the CPU
// backend's passes compute their terms on the fly and add them the same way).
SAMPLERD_EXACT_SUM_HD ChunkSum SumChunk(const double* x, uint64_t count) {
  uint64_t max_bits = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t b = TermBits(x[i]);
    max_bits = b > max_bits ? b : max_bits;
  }
  ChunkSum result;
  result.exponent = ChunkExponent(max_bits);
  for (uint64_t i = 0; i < count; ++i) result.sum += Quantise(TermBits(x[i]), result.exponent);
  return result;
}

}  // namespace exact_sum
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_EXACT_SUM_H_
