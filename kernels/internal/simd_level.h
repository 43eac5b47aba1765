// Which SIMD instruction sets this CPU offers, for the vectorised loops of the CPU backend.
//
// Every vectorised loop in kernels/internal/ has one version per level and returns the same
// bits at every level (integer arithmetic, or IEEE operations in a fixed order without FMA);
// tests run each version the CPU supports against the scalar definition.
#ifndef SAMPLERD_KERNELS_INTERNAL_SIMD_LEVEL_H_
#define SAMPLERD_KERNELS_INTERNAL_SIMD_LEVEL_H_

#include <vector>

namespace samplerd {
namespace internal {

enum class SimdLevel {
  kScalar,  // Baseline x86-64 (SSE2), or any other architecture.
  kAvx2,    // AVX2.
  kAvx512,  // AVX-512 F, DQ, VL and BW.
};

// The widest level this CPU supports; the vectorised functions use it unless told otherwise.
SimdLevel BestSimdLevel();

// Every level up to BestSimdLevel() (for tests).
std::vector<SimdLevel> SupportedSimdLevels();

}  // namespace internal
}  // namespace samplerd

// Function attributes that compile one version of a loop for a level (GCC and Clang, x86-64).
#if defined(__x86_64__)
#define SAMPLERD_TARGET_AVX2 __attribute__((target("avx2")))
#define SAMPLERD_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
#else
#define SAMPLERD_TARGET_AVX2
#define SAMPLERD_TARGET_AVX512
#endif

// A loop's body, written once and force-inlined into each level's function above (which compiles
// it for that level). Not `target_clones`: its resolver runs while the dynamic loader relocates
// the binary, before a sanitizer's runtime is up, and under ThreadSanitizer (instrumented
// resolver) every binary linking it crashed at load (docs/HARDENING.md).
#define SAMPLERD_INLINE __attribute__((always_inline)) inline

#endif  // SAMPLERD_KERNELS_INTERNAL_SIMD_LEVEL_H_
