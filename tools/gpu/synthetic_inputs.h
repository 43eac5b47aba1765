// Deterministic pseudo-random inputs that the backend comparison sends to both servers: static
// weights, class labels and per-sample losses, each a pure function of (seed, index) (losses: of
// (seed, epoch, index)), so that both servers receive the same bits whatever order the calls run
// in, and a loss does not depend on the shard position it is reported at (an index drawn twice,
// or a padded position, carries the same loss: the server's "one loss per sample per epoch" rule
// then applies whichever copy arrives first, with the same result).
#ifndef SAMPLERD_TOOLS_GPU_SYNTHETIC_INPUTS_H_
#define SAMPLERD_TOOLS_GPU_SYNTHETIC_INPUTS_H_

#include <cmath>
#include <cstdint>

namespace samplerd {
namespace gpu_e2e {

// SplitMix64's finaliser: a bijective mix of 64 bits (Steele, Lea, Flood 2014).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t Hash(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return Mix64(Mix64(seed ^ Mix64(a)) ^ b);
}

// A static weight (UploadWeights): zeros (1/16; with `zeros` false, ties at 1 instead: a plan
// of M = N without replacement needs every weight positive), ties at exactly 1 (1/16), and
// otherwise a mantissa in [1, 2) scaled by 2^e with e in [-60, 60], so that the ratio of
// positive weights reaches ~2^121, inside the API's 2^126 bound (proto UploadWeightsChunk).
// Index 0 is always 1: the weights are never all zero.
inline float SyntheticWeight(uint64_t seed, uint64_t index, bool zeros = true) {
  if (index == 0) return 1.0f;
  const uint64_t h = Hash(seed, index, 0x57a71c);
  switch (h & 15) {
    case 0:
      return zeros ? 0.0f : 1.0f;
    case 1:
      return 1.0f;
    default: {
      const float mantissa = 1.0f + static_cast<float>((h >> 8) & 0xffffff) * 0x1p-24f;
      const int exponent = static_cast<int>((h >> 40) % 121) - 60;
      return std::ldexp(mantissa, exponent);
    }
  }
}

// A class label (UploadLabels): class k with probability 2^-(k+1) for k < 10 (strongly
// imbalanced), and a rare class far from the others (a label value, not an array index).
inline uint32_t SyntheticLabel(uint64_t seed, uint64_t index) {
  const uint64_t h = Hash(seed, index, 0x1abe1);
  if ((h & 0xfff) == 0) return 4000000000u;
  uint32_t k = 0;
  uint64_t bits = h >> 12;
  while (k < 10 && (bits & 1) == 0) {
    ++k;
    bits >>= 1;
  }
  return k;
}

// A loss (ReportLosses): exact zeros (1/64), rare large values (1/1024: 1000), otherwise
// 8 u^3 for u uniform in [0, 1) (most losses small, a long tail).
inline float SyntheticLoss(uint64_t seed, uint64_t epoch, uint64_t index) {
  const uint64_t h = Hash(seed ^ Mix64(epoch + 0x10551), index, 0x1055);
  if ((h & 63) == 0) return 0.0f;
  if ((h & 1023) == 1) return 1000.0f;
  const double u = static_cast<double>(h >> 11) * 0x1p-53;
  return static_cast<float>(8.0 * u * u * u);
}

}  // namespace gpu_e2e
}  // namespace samplerd

#endif  // SAMPLERD_TOOLS_GPU_SYNTHETIC_INPUTS_H_
