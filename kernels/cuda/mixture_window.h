// The window of a mixture job on the device (docs/SAMPLING.md, "Mixture jobs", "The window"),
// bit-identical to kernels/mixture/window.h's PlanWindow: one thread per window position runs
// window_math.h's per-entry rule (the group by a binary search over the counts' prefix sums, then
// the group's pass order), and the entries are shuffled by the plans' device shuffle
// (device_plan.h's Shuffle). Host API without Abseil, like device_plan.h: device pointers and a
// stream, the first CUDA error returned (cudaErrorInvalidValue for a violated precondition,
// before anything is enqueued). The caller validates the window on the host first
// (kernels/mixture/window.h's ValidateWindowInto) and computes the new cursors there (O(K),
// CursorsAfter): the CUDA backend's ComputeBackend::PlanMixtureWindow (cuda_backend.cc).
// Thread-safe: no state besides the arguments.
#ifndef SAMPLERD_KERNELS_CUDA_MIXTURE_WINDOW_H_
#define SAMPLERD_KERNELS_CUDA_MIXTURE_WINDOW_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/mixture/window_math.h"

namespace samplerd {
namespace gpu {

// A window's groups in device memory (K entries each; count_prefix K + 1: the exclusive prefix
// sums of the counts, count_prefix[K] = M).
struct DeviceMixtureGroups {
  uint32_t groups = 0;
  const uint64_t* offsets = nullptr;
  const uint64_t* sizes = nullptr;
  const mixture::GroupCursor* cursors = nullptr;
  const uint64_t* count_prefix = nullptr;
};

// out[w] = the entry at window position w before the shuffle (window.h's FillWindow), w < m.
cudaError_t FillMixtureWindow(uint64_t seed, const DeviceMixtureGroups& groups, uint64_t m,
                              uint64_t* out, cudaStream_t stream);

// out = the window (FillMixtureWindow, then Shuffle under (seed, epoch)); m <= 2^34. Scratch:
// 8 B per entry for the filled entries, plus the shuffle's.
cudaError_t PlanMixtureWindow(uint64_t seed, uint64_t epoch, const DeviceMixtureGroups& groups,
                              uint64_t m, uint64_t* out, cudaStream_t stream);

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_MIXTURE_WINDOW_H_
