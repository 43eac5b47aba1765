// det::Log2 and det::Exp2 (kernels/det_math.h) over arrays, vectorised where the CPU allows.
//
// Bit-identical to the scalar functions for every input: the same IEEE operations in the same
// order, with the special cases (zero, negative, subnormal, infinite, NaN, overflow) selected
// without branches, and FMA contraction off. One version per SimdLevel; the best the CPU
// supports is used. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_DET_MATH_BATCH_H_
#define SAMPLERD_KERNELS_INTERNAL_DET_MATH_BATCH_H_

#include <cstdint>

#include "kernels/internal/simd_level.h"

namespace samplerd {
namespace internal {

// out[k] = det::Log2(x[k]) for k < count. `out` may alias `x`.
void Log2Many(const double* x, uint64_t count, double* out);

// out[k] = det::Exp2(y[k]) for k < count. `out` may alias `y`.
void Exp2Many(const double* y, uint64_t count, double* out);

// The same with an explicit version (tests compare them); `level` <= BestSimdLevel().
void Log2ManyWith(SimdLevel level, const double* x, uint64_t count, double* out);
void Exp2ManyWith(SimdLevel level, const double* y, uint64_t count, double* out);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_DET_MATH_BATCH_H_
