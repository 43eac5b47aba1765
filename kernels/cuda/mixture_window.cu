// The device window of a mixture job: see mixture_window.h.
#include <cstdint>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/device_plan.h"
#include "kernels/cuda/mixture_window.h"
#include "kernels/mixture/window_math.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace gpu {
namespace {

using internal::AsyncBuffer;
using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;

constexpr unsigned kBlock = 256;

// Neighbouring threads mostly share a group (and so its pass key's inputs), so the binary
// search's reads of count_prefix hit the same lines across a warp.
__global__ void __launch_bounds__(kBlock)
    FillKernel(uint64_t seed, DeviceMixtureGroups groups, uint64_t m, uint64_t* out) {
  for (uint64_t w = GlobalThread(); w < m; w += GridStride()) {
    const uint32_t k = mixture::GroupOfWindowPosition(groups.count_prefix, groups.groups, w);
    out[w] = mixture::WindowEntry(seed, k, groups.offsets[k], groups.sizes[k], groups.cursors[k],
                                  w - groups.count_prefix[k]);
  }
}

}  // namespace

cudaError_t FillMixtureWindow(uint64_t seed, const DeviceMixtureGroups& groups, uint64_t m,
                              uint64_t* out, cudaStream_t stream) {
  if (groups.groups == 0 || groups.offsets == nullptr || groups.sizes == nullptr ||
      groups.cursors == nullptr || groups.count_prefix == nullptr || (m > 0 && out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  FillKernel<<<GridFor(m, kBlock), kBlock, 0, stream>>>(seed, groups, m, out);
  SAMPLERD_CUDA_TRY_LAUNCH();
  return cudaSuccess;
}

cudaError_t PlanMixtureWindow(uint64_t seed, uint64_t epoch, const DeviceMixtureGroups& groups,
                              uint64_t m, uint64_t* out, cudaStream_t stream) {
  if (m > plan_math::kMaxShuffleInputs) return cudaErrorInvalidValue;
  AsyncBuffer entries;
  SAMPLERD_CUDA_TRY(entries.Allocate(m * sizeof(uint64_t), stream));
  SAMPLERD_CUDA_TRY(FillMixtureWindow(seed, groups, m, entries.as<uint64_t>(), stream));
  return Shuffle<uint64_t>(seed, epoch, m, entries.as<uint64_t>(), out, stream);
}

}  // namespace gpu
}  // namespace samplerd
