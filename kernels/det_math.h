// Deterministic floating-point math for anything that decides an index.
//
// std::log2/exp2/pow differ between libm versions and between host and device. These use only
// IEEE-754 +, -, *, / (correctly rounded everywhere) and exact bit manipulation, in a fixed order;
// build with FMA contraction off (-ffp-contract=off, nvcc -fmad=false) and they return
// bit-identical results on every x86-64 host and every CUDA device.
#ifndef SAMPLERD_KERNELS_DET_MATH_H_
#define SAMPLERD_KERNELS_DET_MATH_H_

#include <cstdint>
#include <cstring>

#include "kernels/philox.h"  // SAMPLERD_HD

namespace samplerd {
namespace det {

SAMPLERD_HD uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

SAMPLERD_HD double FromBits(uint64_t b) {
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// 2^k as a double for -1022 <= k <= 1023 (exact).
SAMPLERD_HD double Pow2(int k) { return FromBits(static_cast<uint64_t>(k + 1023) << 52); }

// A uniform double in the open interval (0, 1) from 64 random bits: ((r >> 12) + 0.5) / 2^52.
// (52 bits, not 53: k + 0.5 is exact in a double only for k < 2^52, so 1 is never reached.)
SAMPLERD_HD double UniformOpen01(uint64_t r) {
  return (static_cast<double>(r >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

// The polynomial cores of Log2 and Exp2, shared with the vectorised loops of
// kernels/internal/ (the same operations in the same order, so the results are bit-identical).
// Templates on the value type T: double here and on the device; kernels/internal/det_math_batch
// passes groups of vector registers, so that the polynomials of several samples are evaluated
// side by side (each lane with exactly the operations below). Force-inlined on the host: the
// vectorised loops are compiled once per SIMD level, and an out-of-line copy would be compiled
// for the baseline level only.
#if defined(__CUDACC__)
#define SAMPLERD_HD_CORE SAMPLERD_HD
#else
#define SAMPLERD_HD_CORE inline __attribute__((always_inline))
#endif

// e + log2(m) for a reduced mantissa m in [sqrt(1/2), sqrt(2)) and an integral e.
template <typename T>
SAMPLERD_HD_CORE T Log2OfReducedT(T m, T e) {
  // ln(m) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), s = (m - 1) / (m + 1).
  const T s = (m - 1.0) / (m + 1.0);
  const T s2 = s * s;
  T p = s2 * (1.0 / 23.0) + 1.0 / 21.0;  // Horner from p = 1/23 (x * y is y * x in IEEE).
  p = p * s2 + 1.0 / 19.0;
  p = p * s2 + 1.0 / 17.0;
  p = p * s2 + 1.0 / 15.0;
  p = p * s2 + 1.0 / 13.0;
  p = p * s2 + 1.0 / 11.0;
  p = p * s2 + 1.0 / 9.0;
  p = p * s2 + 1.0 / 7.0;
  p = p * s2 + 1.0 / 5.0;
  p = p * s2 + 1.0 / 3.0;
  p = p * s2 + 1.0;
  const T ln_m = 2.0 * s * p;
  return e + ln_m * 1.4426950408889634;  // 1 / ln 2
}
SAMPLERD_HD_CORE double Log2OfReduced(double m, double e) { return Log2OfReducedT(m, e); }

// e^t for t in [0, ln 2).
template <typename T>
SAMPLERD_HD_CORE T ExpOfReducedT(T t) {
  // e^t by its Taylor series (Horner), t < 0.7: 20 terms reach 1e-20.
  T p = t * (1.0 / 2432902008176640000.0) + 1.0 / 121645100408832000.0;  // From p = 1/20!.
  p = p * t + 1.0 / 6402373705728000.0;
  p = p * t + 1.0 / 355687428096000.0;
  p = p * t + 1.0 / 20922789888000.0;
  p = p * t + 1.0 / 1307674368000.0;
  p = p * t + 1.0 / 87178291200.0;
  p = p * t + 1.0 / 6227020800.0;
  p = p * t + 1.0 / 479001600.0;
  p = p * t + 1.0 / 39916800.0;
  p = p * t + 1.0 / 3628800.0;
  p = p * t + 1.0 / 362880.0;
  p = p * t + 1.0 / 40320.0;
  p = p * t + 1.0 / 5040.0;
  p = p * t + 1.0 / 720.0;
  p = p * t + 1.0 / 120.0;
  p = p * t + 1.0 / 24.0;
  p = p * t + 1.0 / 6.0;
  p = p * t + 0.5;
  p = p * t + 1.0;
  p = p * t + 1.0;
  return p;
}
SAMPLERD_HD_CORE double ExpOfReduced(double t) { return ExpOfReducedT(t); }

// log2(x) for finite x > 0; relative error below 1e-15. Returns -inf for 0, NaN for x < 0.
SAMPLERD_HD double Log2(double x) {
  if (!(x > 0.0))
    return x == 0.0 ? -FromBits(0x7ff0000000000000ull) : FromBits(0x7ff8000000000000ull);
  if (x == FromBits(0x7ff0000000000000ull)) return x;
  int e = 0;
  if (x < Pow2(-1022)) {  // Subnormal: scale into the normal range (exact).
    x *= Pow2(54);
    e = -54;
  }
  const uint64_t b = Bits(x);
  e += static_cast<int>((b >> 52) & 0x7ff) - 1023;
  double m = FromBits((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {  // Reduce to [sqrt(1/2), sqrt(2)): |s| <= 0.1716.
    m *= 0.5;
    e += 1;
  }
  return Log2OfReduced(m, static_cast<double>(e));
}

// 2^y; relative error below 1e-15 for |y| < 1000; 0 below -1074, +inf from 1024.
SAMPLERD_HD double Exp2(double y) {
  if (y != y) return y;
  if (y >= 1024.0) return FromBits(0x7ff0000000000000ull);
  if (y < -1075.0) return 0.0;
  int k = static_cast<int>(y);  // Truncates toward zero; make it floor.
  if (static_cast<double>(k) > y) --k;
  const double t = (y - static_cast<double>(k)) * 0.6931471805599453;  // f ln 2, in [0, ln 2)
  const double p = ExpOfReduced(t);                                    // e^t in [1, 2)
  if (k >= -1022) return p * Pow2(k);
  return (p * Pow2(k + 64)) * Pow2(-64);  // Subnormal result: two exact-as-possible steps.
}

// x^y = 2^(y log2 x) for x > 0; x == 0 gives 0 for y > 0 and 1 for y == 0.
SAMPLERD_HD double Pow(double x, double y) {
  if (y == 0.0) return 1.0;
  if (x == 0.0) return 0.0;
  return Exp2(y * Log2(x));
}

}  // namespace det
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_DET_MATH_H_
