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

// The steps of det::Log2, each special case computed alongside and selected at the end.
// Inlined into one function per SIMD level, which the compiler vectorises for that level.
__attribute__((always_inline)) inline void Log2Loop(const double* x_in, uint64_t count,
                                                    double* out) {
  for (uint64_t k = 0; k < count; ++k) {
    const double x = x_in[k];
    // Subnormal (or not positive, whose result is replaced below): scale by 2^54 (exact).
    const uint64_t subnormal = Mask(x < FromBits(0x0010000000000000ull));
    const double scaled = x * FromBits(Select(subnormal, 0x4350000000000000ull, kOneBits));
    const uint64_t b = ToBits(scaled);
    // 32-bit exponents: AVX2 converts 32-bit, not 64-bit, integers to doubles.
    const int32_t e0 =
        static_cast<int32_t>((b >> 52) & 0x7ff) - 1023 - static_cast<int32_t>(subnormal & 54);
    const double m0 = FromBits((b & 0x000fffffffffffffull) | kOneBits);  // [1, 2)
    const uint64_t halve = m0 > 1.4142135623730951;
    const double m = m0 * FromBits(kOneBits - (halve << 52));  // * 0.5 or * 1.
    const int32_t e = e0 + static_cast<int32_t>(halve);
    uint64_t result = ToBits(det::Log2OfReduced(m, static_cast<double>(e)));
    result = Select(Mask(x == FromBits(kInfBits)), kInfBits, result);
    const uint64_t special = Select(Mask(x == 0.0), kInfBits | (uint64_t{1} << 63), kNanBits);
    out[k] = FromBits(Select(Mask(!(x > 0.0)), special, result));
  }
}

// The steps of det::Exp2, likewise.
__attribute__((always_inline)) inline void Exp2Loop(const double* y_in, uint64_t count,
                                                    double* out) {
  for (uint64_t i = 0; i < count; ++i) {
    const double y_raw = y_in[i];
    // Bitwise & rather than &&: no branches, so that the loop vectorises.
    const bool in_range = (y_raw >= -1075.0) & (y_raw < 1024.0);  // False for NaN too.
    const double y = FromBits(ToBits(y_raw) & Mask(in_range));    // 0 out of range.
    int32_t k = static_cast<int32_t>(y);  // Truncation (32 bits: see Log2Loop); make it floor.
    k -= static_cast<double>(k) > y;
    const double t = (y - static_cast<double>(k)) * 0.6931471805599453;
    const double p = det::ExpOfReduced(t);
    const int32_t normal = -static_cast<int32_t>(k >= -1022);  // All ones when normal.
    const double r_normal = p * Pow2(k & normal);
    const double r_subnormal = (p * Pow2((k + 64) & ~normal)) * Pow2(-64);
    uint64_t result = Select(Mask(normal != 0), ToBits(r_normal), ToBits(r_subnormal));
    result = Select(Mask(y_raw < -1075.0), 0, result);
    result = Select(Mask(y_raw >= 1024.0), kInfBits, result);
    result = Select(Mask(y_raw != y_raw), ToBits(y_raw), result);
    out[i] = FromBits(result);
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
