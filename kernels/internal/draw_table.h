// Draws with replacement: quantised weights, exact integer prefix sums, and a guide table.
//
// Definition (what every backend must return): the weights are quantised to integers q_i (see
// ChooseQuantisationScale), prefix[i] = q_0 + ... + q_{i-1}, T = prefix[N]. Draw j of an epoch
// takes r = RandomBits64(seed, epoch, kDraw, j), t = floor(r * T / 2^64), and returns the unique
// i with prefix[i] <= t < prefix[i + 1] -- what a binary search over `prefix` gives (a GPU does
// that). Zero weights have empty intervals and are never drawn. With uniform weights (no table)
// draw j is floor(r * N / 2^64).
//
// The CPU finds i through a guide table (Chen and Asau's indexed search): guide[k] is the i of
// the smallest t of the r-range k = r >> guide_shift, so a draw is one guide lookup and a scan
// of ~2-4 prefix sums. Everything here is a pure function of its inputs, for any thread count.
#ifndef SAMPLERD_KERNELS_INTERNAL_DRAW_TABLE_H_
#define SAMPLERD_KERNELS_INTERNAL_DRAW_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "kernels/large_array.h"
#include "kernels/philox.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace internal {

// The power-of-two scale 2^s of the quantisation, chosen from the largest weight so that
// sum q_i < 2^63: q_i = floor(w_i * 2^s), and 1 for a positive weight that would round to 0
// (a positive weight is never silently dropped). Scaling by a power of two and truncating give
// the same integers on every IEEE machine.
// (plan_math::Quantise and plan_math::QuantisationScale, the rules the device uses too.)
struct QuantisationScale {
  double scale;  // 2^s.
  uint64_t Quantise(float w) const { return plan_math::Quantise(w, scale); }
};

// `weights`: finite, >= 0, at least one > 0 (validated by the caller).
QuantisationScale ChooseQuantisationScale(int threads, absl::Span<const float> weights);

// q_i for every weight (tests and tools; the table below recomputes them instead of storing).
std::vector<uint64_t> QuantiseWeights(int threads, absl::Span<const float> weights);

// Prefix sums and guide table of one weight vector: 8 bytes per sample plus 1-2 for the guide.
struct DrawTable {
  uint64_t num_samples = 0;
  uint64_t total = 0;            // T = prefix[N] < 2^63.
  LargeVector<uint64_t> prefix;  // N + 1 entries (and padding); huge pages (large_array.h).
  LargeVector<uint32_t> guide;   // Empty when N > 2^32 (draws use binary search).
  int guide_shift = 64;          // guide index = r >> guide_shift (guide_shift < 64).
};

DrawTable BuildDrawTable(int threads, absl::Span<const float> weights);

// Bytes that BuildDrawTable allocates for n weights, at most: the prefix sums, the guide table
// and the per-chunk offsets.
uint64_t DrawTableBytes(uint64_t n);

// The draw for random bits r, by binary search over the prefix sums (the definition).
uint64_t DrawByBinarySearch(const DrawTable& table, uint64_t r);

// The same draw through the guide table.
inline uint64_t DrawByGuide(const DrawTable& table, uint64_t r) {
  if (table.guide.empty()) return DrawByBinarySearch(table, r);
  const uint64_t t = MulHi64(r, table.total);
  uint64_t i = table.guide[r >> table.guide_shift];
  while (table.prefix[i + 1] <= t) ++i;
  return i;
}

// out[k] = the draw at plan position first_position + k, for k < out.size().
// T: uint32_t (N <= 2^32) or uint64_t.
template <typename T>
void DrawWeighted(int threads, const DrawTable& table, uint64_t seed, uint64_t epoch,
                  uint64_t first_position, absl::Span<T> out);

// Uniform weights over [0, n): out[k] = floor(r * n / 2^64) for position first_position + k.
inline uint64_t UniformDraw(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t position) {
  return MulHi64(RandomBits64(seed, epoch, RandomStream::kDraw, position), n);
}
template <typename T>
void DrawUniform(int threads, uint64_t seed, uint64_t epoch, uint64_t n, uint64_t first_position,
                 absl::Span<T> out);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_DRAW_TABLE_H_
