// CUDA support shared by the trainer library's device part (device_port_cuda.cc: ShardReader's
// delivery into device memory, LossReporter::ReportFromDevice) and by trainers' own device code:
// the CUDA runtime's errors as absl::Status as a trainer needs them, and whether a usable GPU is
// present. Pinned host buffers: cuda::PinnedBuffer (kernels/cuda/pinned_buffer.h, shared with the
// CUDA backend).
//
// Part of //client/cpp:trainer (not of the CPU-only :trainer_cpu), which always links the CUDA
// runtime; on a machine without a GPU (or driver) every device path fails with
// FAILED_PRECONDITION carrying the runtime's own message, and host paths work.
#ifndef SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_
#define SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/pinned_buffer.h"  // cuda::PinnedBuffer, for the library's users.

namespace samplerd {

// CUDA errors as statuses by kernels/cuda/cuda_status.h, the one conversion, as a trainer needs
// them: FAILED_PRECONDITION for "no usable GPU here", RESOURCE_EXHAUSTED for out of memory,
// INTERNAL otherwise; the message "cuda: <what>: <error name>: <error string>"; the thread's
// last CUDA error reset. kTrainerNoGpu is that choice, for the calls that take it
// (cuda::PinnedBuffer::Allocate).
inline constexpr cuda::NoGpuIs kTrainerNoGpu = cuda::NoGpuIs::kFailedPrecondition;

inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  return cuda::CudaStatus(error, what, kTrainerNoGpu);
}

// OK if the CUDA runtime sees at least one device; otherwise FAILED_PRECONDITION saying why (the
// runtime's message). Cheap after the first call. Tests print its message when they skip.
absl::Status GpuAvailable();

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_
