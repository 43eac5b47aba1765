// The CUDA ComputeBackend (kernels/compute_backend.h): weights recomputed, losses applied and
// epochs planned on one GPU, bit-identical to the CPU backend (docs/SAMPLING.md).
//
// A job's base weights, W_e and loss statistics live in device memory between epochs
// (BackendWeights / BackendLossStats made by this backend). Applied losses are decided on the
// host at the call (a 2-byte epoch marker per sample: the first loss of a sample in an epoch
// wins) and queued in pinned batches that a device kernel applies; the queue is drained before
// anything reads the statistics. A plan is computed on the device and copied to the host once.
//
// Device errors (out of memory, a failed launch) come back as statuses carrying the CUDA error
// name and string (RESOURCE_EXHAUSTED for out of memory, INTERNAL otherwise) on the call that
// met them; the backend never switches to the CPU.
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"

namespace samplerd {

struct CudaBackendOptions {
  int device = 0;
  // At startup, the device must have at least this much free memory.
  uint64_t min_free_bytes = uint64_t{1} << 30;
};

// Checks the device (gpu_presence.h: driver, device, free memory) and makes the backend.
// FAILED_PRECONDITION naming what is missing (no driver, driver too old, no device, too little
// free memory) with the runtime's own error.
absl::StatusOr<std::unique_ptr<ComputeBackend>> NewCudaBackend(const CudaBackendOptions& options);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_BACKEND_H_
