// The uniform shuffle of samplerd's plans: scatter into random buckets, then Fisher-Yates inside
// each bucket (Sanders, "Random permutations on distributed, external and hierarchical memory",
// IPL 1998).
//
// Definition (what every backend must return; docs/SAMPLING.md), for the inputs x_0, ...,
// x_{m-1} in their given order, with words(stream, c) = the four 32-bit words of
// RandomBlock(seed, epoch, stream, c):
//   1. b = plan_math::ShuffleBucketBits(m): the smallest b with m <= 1024 * 2^b
//      (kernels/plan_math.h, the one home of the rule, shared with the device). Input k goes to
//      bucket
//        B_k = the top b bits of words(kShuffle, k / 4)[k % 4]    (B_k = 0 when b = 0).
//   2. The output lists bucket 0, then bucket 1, ...; each bucket holds its inputs in input order.
//   3. Each bucket B (n entries, a[0, n)) is shuffled by Fisher-Yates: for i = n-1 down to 1,
//      swap a[i] and a[j], j uniform in [0, i]. The j are drawn in that order from the 32-bit words
//      u_0, u_1, ... with u_t = words(kShuffleSwap, B * 2^40 + t / 4)[t % 4], by Lemire's
//      multiply-shift with rejection (exact): j = (u * (i+1)) >> 32, drawing u again while the
//      low 32 bits of u * (i+1) are below 2^32 mod (i+1).
// The result is a uniformly random permutation: every input lands in an independent, uniformly
// random bucket, and every bucket is permuted uniformly. The counter layout B * 2^40 + t / 4
// needs B < 2^24, so m <= plan_math::kMaxShuffleInputs = 2^34 (PlanEpoch rejects larger plans
// without replacement).
//
// Why buckets of 512-1024 inputs on average (m > 1024): a GPU shuffles each bucket in shared
// memory, one thread block per group of buckets, after a stable partition by bucket; and the
// bucket of an input is recomputed from k in any pass (no carried state).
//
// How the CPU computes it: when b <= max_top_bits (default kMaxShuffleTopBits = 14, i.e.
// m <= 2^24), one stable scatter by bucket through 64-byte write-combining lines, then
// Fisher-Yates per bucket. Beyond, a two-level stable partition: pass A scatters by the top 10
// bits (1024 buckets: the lines of both writers stay in L2), carrying each input's remaining
// bucket bits in a 16-bit side array; pass B, in parallel over the top-level buckets, partitions
// each one by those bits (a counting sort, in L2) and runs Fisher-Yates on its final buckets.
// An input costs half a 32-bit Philox word for its bucket (computed twice) and one word for its
// swap. (A two-level pass at 2^24 and below measured ~1.6x slower than one level at N = 1e7:
// two scattered writes per input instead of one.)
//
// Results depend neither on `threads` nor on `max_top_bits`. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
#define SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_

#include <cstdint>
#include <functional>

#include "absl/types/span.h"

namespace samplerd {
namespace internal {

// The most bucket bits the CPU partitions in one pass (the one-level path, up to m = 2^24).
constexpr int kMaxShuffleTopBits = 14;

// out = the shuffle of the inputs 0, 1, ..., out.size() - 1. T: uint32_t (out.size() <= 2^32) or
// uint64_t. out.size() <= plan_math::kMaxShuffleInputs. max_top_bits (>= 1) changes only how the
// result is computed, never the result: tests lower it to run the two-level partition on small
// inputs.
template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, absl::Span<T> out,
                  int max_top_bits = kMaxShuffleTopBits);

// out = the shuffle of `indices` (in their given order: the result depends on it). out.size()
// must equal indices.size(); T and max_top_bits as above (every index must fit in T).
template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    absl::Span<T> out, int max_top_bits = kMaxShuffleTopBits);

// The inputs k, ..., k + count - 1 (count <= 512) into values[0, count). Called by several
// threads at once (each on its own inputs), once per input.
using InputBlockFn = std::function<void(uint64_t k, uint64_t count, uint64_t* values)>;

// out = the shuffle of the inputs inputs(0), ..., inputs(out.size() - 1) (T = uint64_t): the same
// result as ShuffleIndices of those inputs, without holding them: each is computed once, in
// blocks, when it is scattered (a mixture window's pass-order entries, kernels/mixture/window.h).
template <typename T>
void ShuffleGenerated(int threads, uint64_t seed, uint64_t epoch, const InputBlockFn& inputs,
                      absl::Span<T> out, int max_top_bits = kMaxShuffleTopBits);

// Memory that one Shuffle of m inputs allocates besides `out` (at the default max_top_bits):
// the per-thread cursors and 64-byte write-combining lines of the first pass's buckets (2^14 at
// most: ~1.3 MiB per thread); and when m > 2^24 (two levels) the 16-bit side array (2 m bytes)
// and, per thread, a copy of a top-level bucket (~m / 2^10 entries: bounded with 16 standard
// deviations to spare, which no seed exceeds in practice).
uint64_t ShuffleScratchBytes(int threads, uint64_t m);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
