// CUDA errors as statuses: the one conversion of the CUDA backend (compute_backend.h's error
// contract) and of the trainer library's device paths (client/cpp/cuda_support.h). The code says
// what to do next:
//   RESOURCE_EXHAUSTED  out of memory (retry with a smaller job, or once memory is freed);
//   FAILED_PRECONDITION no usable GPU here: no device, no or too old a driver, the devices busy
//                       or unavailable, the runtime failing to initialise (fix the machine, or
//                       run without the GPU);
//   INTERNAL            every other error (a failed launch, a kernel fault).
// The message names what was being done and carries the runtime's error name and string:
//   "cuda: cudaMallocAsync of 4000000000 bytes for the weights: cudaErrorMemoryAllocation: out of
//   memory".
// Header-only: it calls the CUDA runtime that the binary links (the backend links it statically,
// the trainer library dynamically).
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_STATUS_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace samplerd {
namespace cuda {

// OK for cudaSuccess; otherwise the status of `error` met while doing `what`, and the calling
// thread's last CUDA error is reset (cudaGetLastError), so that an error reported once is not
// reported again by a later, unrelated launch check on this thread (another job's plan after
// this one ran out of memory; a trainer's own kernel). A sticky error (a kernel fault) survives
// the reset and keeps failing every later call.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  static_cast<void>(cudaGetLastError());
  std::string message =
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace cuda
}  // namespace samplerd

// Returns the status of `expr` (a cudaError_t) from the enclosing function unless it succeeded.
#define SAMPLERD_RETURN_IF_CUDA_ERROR(expr, what)                                               \
  do {                                                                                          \
    if (const cudaError_t samplerd_cuda_error_ = (expr); samplerd_cuda_error_ != cudaSuccess) { \
      return ::samplerd::cuda::CudaStatus(samplerd_cuda_error_, what);                          \
    }                                                                                           \
  } while (0)

// Returns `expr` (an absl::Status) from the enclosing function unless it is OK.
#define SAMPLERD_RETURN_IF_ERROR(expr)                                    \
  do {                                                                    \
    if (absl::Status samplerd_status_ = (expr); !samplerd_status_.ok()) { \
      return samplerd_status_;                                            \
    }                                                                     \
  } while (0)

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_STATUS_H_
