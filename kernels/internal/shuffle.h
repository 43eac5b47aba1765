// The uniform shuffle of samplerd's plans: a sort of the indices by random keys.
//
// Definition (what every backend must return): the indices ordered by increasing
// (ShuffleKey(seed, epoch, index), index), ShuffleKey = 64 bits of Philox on the kShuffle stream.
// A GPU gets it from a radix sort of (key, index) pairs; the CPU version below gets the same
// order without storing keys. Results do not depend on `threads`. Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
#define SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_

#include <cstdint>
#include <functional>

#include "absl/types/span.h"
#include "kernels/philox.h"

namespace samplerd {
namespace internal {

// Sort key of `index` in the shuffle of `epoch`.
inline uint64_t ShuffleKey(uint64_t seed, uint64_t epoch, uint64_t index) {
  return RandomBits64(seed, epoch, RandomStream::kShuffle, index);
}

// out = 0, 1, ..., out.size() - 1 ordered by (ShuffleKey, index): a uniformly random permutation.
// T: uint32_t (out.size() <= 2^32) or uint64_t.
//
// How: the top bits of the key split the indices into ~m/4096 buckets (per-thread histograms,
// an exclusive scan, then a scatter of the indices straight into `out`); each bucket, small
// enough for the L2 cache, is then sorted on its own. Keys are recomputed (vectorised Philox)
// instead of stored, so the only memory beyond `out` is per-thread scratch of a few hundred KiB.
template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, absl::Span<T> out);

// out = `indices` (distinct, any order) ordered by (ShuffleKey, index). out.size() must equal
// indices.size(); T as above (every index must fit in T).
template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    absl::Span<T> out);

// The same, into an output that `allocate` creates: allocate() is called once, on the calling
// thread, while other threads already run the first pass over the keys, so that the page faults
// and zero-filling of a large new output overlap with it. It must return a span of `m` entries
// (resp. indices.size()).
template <typename T>
void ShuffleRange(int threads, uint64_t seed, uint64_t epoch, uint64_t m,
                  const std::function<absl::Span<T>()>& allocate);
template <typename T>
void ShuffleIndices(int threads, uint64_t seed, uint64_t epoch, absl::Span<const uint64_t> indices,
                    const std::function<absl::Span<T>()>& allocate);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_SHUFFLE_H_
