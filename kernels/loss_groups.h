// The groups of the LOSS policy's loss_within_groups (docs/SAMPLING.md, "Loss within groups"):
// the samples of equal base weight (weight_math::GroupKey), numbered in increasing key order.
// One home for the table that the CPU backend, the CUDA backend (on the host, before its
// kernels) and the sequential reference all use.
//
// Header-only and free of Abseil: the GPU machine's reference build has none. Thread-safe (pure
// functions).
#ifndef SAMPLERD_KERNELS_LOSS_GROUPS_H_
#define SAMPLERD_KERNELS_LOSS_GROUPS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/weight_math.h"

namespace samplerd {

// The groups of N base weights: keys[g] (ascending) and counts[g] = n_g, the number of samples
// whose weight has key keys[g].
struct LossGroupTable {
  std::vector<uint32_t> keys;
  std::vector<uint64_t> counts;

  uint32_t size() const { return static_cast<uint32_t>(keys.size()); }
};

// The table of base[0, n), or false (and `out` unspecified) when the weights have more than
// max_groups distinct keys. O(n log K) for K groups.
inline bool FindLossGroups(const float* base, uint64_t n, uint64_t max_groups,
                           LossGroupTable* out) {
  out->keys.clear();
  out->counts.clear();
  uint32_t last_key = 0;
  uint64_t last_group = ~uint64_t{0};  // Consecutive samples often share a group: no search.
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t key = weight_math::GroupKey(base[i]);
    if (last_group != ~uint64_t{0} && key == last_key) {
      ++out->counts[last_group];
      continue;
    }
    const auto at = std::lower_bound(out->keys.begin(), out->keys.end(), key);
    const uint64_t g = static_cast<uint64_t>(at - out->keys.begin());
    if (at == out->keys.end() || *at != key) {
      if (out->keys.size() == max_groups) return false;
      out->keys.insert(at, key);
      out->counts.insert(out->counts.begin() + static_cast<std::ptrdiff_t>(g), 0);
    }
    ++out->counts[g];
    last_key = key;
    last_group = g;
  }
  return true;
}

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LOSS_GROUPS_H_
