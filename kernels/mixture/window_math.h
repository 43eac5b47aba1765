// The per-entry rule of a mixture job's window (docs/SAMPLING.md, "Mixture jobs", "The
// window"), host + device: which group fills a window position, and which sample it takes. One
// home for the rule: the CPU fill (kernels/mixture/window.cc) and the CUDA kernel
// (kernels/cuda/mixture_window.cu) call these. Header-only, free of Abseil and libm.
// Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_MIXTURE_WINDOW_MATH_H_
#define SAMPLERD_KERNELS_MIXTURE_WINDOW_MATH_H_

#include <cstdint>

#include "kernels/mixture/pass_order.h"
#include "kernels/philox.h"

namespace samplerd {
namespace mixture {

// Where a group stands in its passes: the next entry it contributes is entry `position` of its
// pass number `pass` (position < the group's size).
struct GroupCursor {
  uint64_t position = 0;
  uint64_t pass = 0;
};

// The group of window position w (before the shuffle): the k with count_prefix[k] <= w <
// count_prefix[k + 1], where count_prefix holds groups + 1 entries, the exclusive prefix sums
// of the window's counts (count_prefix[groups] = M, w < M). Groups with a count of 0 are never
// the answer. A binary search: O(log K).
SAMPLERD_HD uint32_t GroupOfWindowPosition(const uint64_t* count_prefix, uint32_t groups,
                                           uint64_t w) {
  uint32_t lo = 0, hi = groups;  // Invariant: count_prefix[lo] <= w < count_prefix[hi].
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (count_prefix[mid] <= w) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The cursor of a group after it contributed `taken` entries from `cursor` (size n >= 1):
// position + taken entries into the passes from the cursor's pass on. The caller checks that
// the pass number does not pass 2^64 - 1 (window.cc's ValidateWindow).
SAMPLERD_HD GroupCursor AdvanceCursor(GroupCursor cursor, uint64_t n, uint64_t taken) {
  const uint64_t total = cursor.position + taken;  // < 2^63 + 2^34: no overflow.
  return {total % n, cursor.pass + total / n};
}

// The sample that the group of number `group` (global indices [offset, offset + n)) contributes
// as its i-th entry of the window, from `cursor`: offset + At(j mod n) of the pass order of
// pass cursor.pass + j / n, where j = cursor.position + i.
SAMPLERD_HD uint64_t WindowEntry(uint64_t seed, uint32_t group, uint64_t offset, uint64_t n,
                                 GroupCursor cursor, uint64_t i) {
  const GroupCursor at = AdvanceCursor(cursor, n, i);
  return offset + PassOrder(MakePassKey(seed, group, at.pass), n).At(at.position);
}

}  // namespace mixture
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_MIXTURE_WINDOW_MATH_H_
