// The uniform shuffle of samplerd's plans: scatter into random buckets, then Fisher-Yates inside
// each bucket (Sanders, "Random permutations on distributed, external and hierarchical memory",
// IPL 1998).
//
// Definition (what every backend must return), for the inputs x_0, ..., x_{m-1} in their given
// order, with words(stream, c) = the four 32-bit words of RandomBlock(seed, epoch, stream, c):
//   1. b = ShuffleBucketBits(m). Input k goes to bucket
//        B_k = the top b bits of words(kShuffle, k / 4)[k % 4]    (B_k = 0 when b = 0).
//   2. The output lists bucket 0, then bucket 1, ...; each bucket holds its inputs in input order.
//   3. Each bucket B (n entries, a[0, n)) is shuffled by Fisher-Yates: for i = n-1 down to 1,
//      swap a[i] and a[j], j uniform in [0, i]. The j are drawn in that order from the 32-bit words
//      u_0, u_1, ... with u_t = words(kShuffleSwap, B * 2^40 + t / 4)[t % 4], by Lemire's
//      multiply-shift with rejection (exact): j = (u * (i+1)) >> 32, drawing u again while the
//      low 32 bits of u * (i+1) are below 2^32 mod (i+1).
// The result is a uniformly random permutation: every input lands in an independent, uniformly
// random bucket, and every bucket is permuted uniformly. It needs m < 2^40 (a plan of 8 TiB).
//
// Why this and not a sort by random keys: a key per input costs a full Philox call; here an
// input costs half a 32-bit word for its bucket (computed twice) and one word for its swap, and
// a bucket (~2400 inputs at 1e7) stays in the L1 cache while it is shuffled. A GPU computes the
// same: a stable partition by bucket (CUB radix sort on b bits), then one bucket per thread block
// in shared memory.
//
// Results do not depend on `threads`. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
#define SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_

#include <cstdint>

#include "absl/types/span.h"

namespace samplerd {
namespace internal {

// b of the definition: the smallest b in [0, 12] with m <= 4096 * 2^b (so buckets average
// 2048-4096 inputs up to m = 2^24, more beyond).
int ShuffleBucketBits(uint64_t m);

// out = the shuffle of the inputs 0, 1, ..., out.size() - 1. T: uint32_t (out.size() <= 2^32) or
// uint64_t.
template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, absl::Span<T> out);

// out = the shuffle of `indices` (in their given order: the result depends on it). out.size()
// must equal indices.size(); T as above (every index must fit in T).
template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    absl::Span<T> out);

// Memory that one Shuffle of m inputs allocates besides `out`, at most: the per-thread bucket
// cursors and 64-byte write-combining lines (at most 4096 buckets: a few MiB even with many
// threads).
uint64_t ShuffleScratchBytes(int threads, uint64_t m);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
