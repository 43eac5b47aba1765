#include "kernels/internal/det_math_batch.h"

#include <cstring>

#include "kernels/det_math.h"

namespace samplerd {
namespace internal {
namespace {

constexpr uint64_t kInfBits = 0x7ff0000000000000ull;
constexpr uint64_t kNanBits = 0x7ff8000000000000ull;
constexpr uint64_t kOneBits = 0x3ff0000000000000ull;

using det::FromBits;
using det::Pow2;
inline uint64_t ToBits(double d) { return det::Bits(d); }
// All ones when `condition`, else 0: for selecting bit patterns without branches.
inline uint64_t Mask(bool condition) { return -static_cast<uint64_t>(condition); }
inline uint64_t Select(uint64_t mask, uint64_t if_set, uint64_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}


// 32 doubles in eight 4-lane vectors (AVX2 registers; halves of AVX-512 ones, or pairs of SSE2
// ones, at the other levels), for the polynomial cores det::Log2OfReducedT and
// det::ExpOfReducedT. A Horner polynomial is a chain of ~40 dependent operations; one vector's
// chain alone leaves the FPU mostly idle, so 32 samples' chains go side by side: each operation
// is applied to the eight vectors in turn (the library is compiled with -fno-tree-ter, which
// keeps that order instead of regrouping each chain: kernels/BUILD). Every lane sees exactly
// the scalar operations, in the same order. Eight was the fastest (16, 24, 32, 48, 64 samples
// tried; AMD EPYC, AVX2: Exp2 6.4 instead of 12.1 clock ticks per sample, Log2 4.6 instead of
// 7.4).
typedef double Vec4 __attribute__((vector_size(32)));
constexpr int kVectorsPerGroup = 8;
struct Group {
  Vec4 v[kVectorsPerGroup];
};
constexpr uint64_t kGroup = 4 * kVectorsPerGroup;

SAMPLERD_INLINE Group LoadGroup(const double* x) {
  Group g;
  std::memcpy(&g, x, sizeof g);
  return g;
}
SAMPLERD_INLINE void StoreGroup(const Group& g, double* x) { std::memcpy(x, &g, sizeof g); }

#define SAMPLERD_GROUP_OPERATOR(op)                                       \
  SAMPLERD_INLINE Group operator op(Group a, const Group& b) {            \
    for (int u = 0; u < kVectorsPerGroup; ++u) a.v[u] = a.v[u] op b.v[u]; \
    return a;                                                             \
  }                                                                       \
  SAMPLERD_INLINE Group operator op(Group a, double b) {                  \
    for (int u = 0; u < kVectorsPerGroup; ++u) a.v[u] = a.v[u] op b;      \
    return a;                                                             \
  }                                                                       \
  SAMPLERD_INLINE Group operator op(double a, Group b) {                  \
    for (int u = 0; u < kVectorsPerGroup; ++u) b.v[u] = a op b.v[u];      \
    return b;                                                             \
  }
SAMPLERD_GROUP_OPERATOR(+)
SAMPLERD_GROUP_OPERATOR(-)
SAMPLERD_GROUP_OPERATOR(*)
SAMPLERD_GROUP_OPERATOR(/)
#undef SAMPLERD_GROUP_OPERATOR

// ---- det::Log2, with each special case computed alongside and selected at the end.

// Before the polynomial: the reduced mantissa m and the exponent e of x.
SAMPLERD_INLINE void Log2Reduce(double x, double& m, double& e) {
  // Subnormal (or not positive, whose result is replaced below): scale by 2^54 (exact).
  const uint64_t subnormal = Mask(x < FromBits(0x0010000000000000ull));
  const double scaled = x * FromBits(Select(subnormal, 0x4350000000000000ull, kOneBits));
  const uint64_t b = ToBits(scaled);
  // 32-bit exponents: AVX2 converts 32-bit, not 64-bit, integers to doubles.
  const int32_t e0 =
      static_cast<int32_t>((b >> 52) & 0x7ff) - 1023 - static_cast<int32_t>(subnormal & 54);
  const double m0 = FromBits((b & 0x000fffffffffffffull) | kOneBits);  // [1, 2)
  const uint64_t halve = m0 > 1.4142135623730951;
  m = m0 * FromBits(kOneBits - (halve << 52));  // * 0.5 or * 1.
  e = static_cast<double>(e0 + static_cast<int32_t>(halve));
}

// After it: the special cases of x.
SAMPLERD_INLINE double Log2Finish(double x, double log2_reduced) {
  uint64_t result = ToBits(log2_reduced);
  result = Select(Mask(x == FromBits(kInfBits)), kInfBits, result);
  const uint64_t special = Select(Mask(x == 0.0), kInfBits | (uint64_t{1} << 63), kNanBits);
  return FromBits(Select(Mask(!(x > 0.0)), special, result));
}

// Inlined into one function per SIMD level, which the compiler vectorises for that level.
SAMPLERD_INLINE void Log2Loop(const double* x_in, uint64_t count, double* out) {
  uint64_t k = 0;
  for (; k + kGroup <= count; k += kGroup) {
    alignas(32) double m[kGroup], e[kGroup];
    for (uint64_t l = 0; l < kGroup; ++l) Log2Reduce(x_in[k + l], m[l], e[l]);
    StoreGroup(det::Log2OfReducedT(LoadGroup(m), LoadGroup(e)), m);
    for (uint64_t l = 0; l < kGroup; ++l) out[k + l] = Log2Finish(x_in[k + l], m[l]);
  }
  for (; k < count; ++k) {
    double m, e;
    Log2Reduce(x_in[k], m, e);
    out[k] = Log2Finish(x_in[k], det::Log2OfReduced(m, e));
  }
}

// ---- det::Exp2, likewise.

// Before the polynomial: y's integral part k (0 for y out of range) and t = frac(y) ln 2.
SAMPLERD_INLINE void Exp2Reduce(double y_raw, int32_t& k, double& t) {
  // Bitwise & rather than &&: no branches, so that the loop vectorises.
  const bool in_range = (y_raw >= -1075.0) & (y_raw < 1024.0);  // False for NaN too.
  const double y = FromBits(ToBits(y_raw) & Mask(in_range));    // 0 out of range.
  k = static_cast<int32_t>(y);  // Truncation (32 bits: see Log2Reduce); make it floor.
  k -= static_cast<double>(k) > y;
  t = (y - static_cast<double>(k)) * 0.6931471805599453;
}

// After it: p = e^t scaled by 2^k, and the special cases of y.
SAMPLERD_INLINE double Exp2Finish(double y_raw, int32_t k, double p) {
  const int32_t normal = -static_cast<int32_t>(k >= -1022);  // All ones when normal.
  const double r_normal = p * Pow2(k & normal);
  const double r_subnormal = (p * Pow2((k + 64) & ~normal)) * Pow2(-64);
  uint64_t result = Select(Mask(normal != 0), ToBits(r_normal), ToBits(r_subnormal));
  result = Select(Mask(y_raw < -1075.0), 0, result);
  result = Select(Mask(y_raw >= 1024.0), kInfBits, result);
  result = Select(Mask(y_raw != y_raw), ToBits(y_raw), result);
  return FromBits(result);
}

SAMPLERD_INLINE void Exp2Loop(const double* y_in, uint64_t count, double* out) {
  uint64_t i = 0;
  for (; i + kGroup <= count; i += kGroup) {
    alignas(32) double t[kGroup];
    int32_t k[kGroup];
    for (uint64_t l = 0; l < kGroup; ++l) Exp2Reduce(y_in[i + l], k[l], t[l]);
    StoreGroup(det::ExpOfReducedT(LoadGroup(t)), t);
    for (uint64_t l = 0; l < kGroup; ++l) out[i + l] = Exp2Finish(y_in[i + l], k[l], t[l]);
  }
  for (; i < count; ++i) {
    int32_t k;
    double t;
    Exp2Reduce(y_in[i], k, t);
    out[i] = Exp2Finish(y_in[i], k, det::ExpOfReduced(t));
  }
}

SAMPLERD_TARGET_AVX512 void Log2Avx512(const double* x, uint64_t count, double* out) {
  Log2Loop(x, count, out);
}
SAMPLERD_TARGET_AVX2 void Log2Avx2(const double* x, uint64_t count, double* out) {
  Log2Loop(x, count, out);
}
void Log2Scalar(const double* x, uint64_t count, double* out) { Log2Loop(x, count, out); }

SAMPLERD_TARGET_AVX512 void Exp2Avx512(const double* y, uint64_t count, double* out) {
  Exp2Loop(y, count, out);
}
SAMPLERD_TARGET_AVX2 void Exp2Avx2(const double* y, uint64_t count, double* out) {
  Exp2Loop(y, count, out);
}
void Exp2Scalar(const double* y, uint64_t count, double* out) { Exp2Loop(y, count, out); }

}  // namespace

void Log2ManyWith(SimdLevel level, const double* x, uint64_t count, double* out) {
  switch (level) {
    case SimdLevel::kAvx512:
      return Log2Avx512(x, count, out);
    case SimdLevel::kAvx2:
      return Log2Avx2(x, count, out);
    case SimdLevel::kScalar:
      break;
  }
  Log2Scalar(x, count, out);
}

void Exp2ManyWith(SimdLevel level, const double* y, uint64_t count, double* out) {
  switch (level) {
    case SimdLevel::kAvx512:
      return Exp2Avx512(y, count, out);
    case SimdLevel::kAvx2:
      return Exp2Avx2(y, count, out);
    case SimdLevel::kScalar:
      break;
  }
  Exp2Scalar(y, count, out);
}

void Log2Many(const double* x, uint64_t count, double* out) {
  Log2ManyWith(BestSimdLevel(), x, count, out);
}

void Exp2Many(const double* y, uint64_t count, double* out) {
  Exp2ManyWith(BestSimdLevel(), y, count, out);
}

}  // namespace internal
}  // namespace samplerd
