// CUDA errors as statuses: the one conversion of the CUDA backend (compute_backend.h's error
// contract) and of the trainer library's device paths (client/cpp/cuda_support.h). The code says
// what to do next:
//   RESOURCE_EXHAUSTED  out of memory (retry with a smaller job, or once memory is freed);
//   FAILED_PRECONDITION (NoGpuIs::kFailedPrecondition only) no usable GPU here: no device, no or
//                       too old a driver, the devices busy or unavailable, the runtime failing
//                       to initialise;
//   INTERNAL            every other error (a failed launch, a kernel fault).
// Who meets "no usable GPU" decides what it means. For a trainer it is its own machine's state:
// FAILED_PRECONDITION (fix the machine, or run without the device path). For the server, which
// checked its GPU at startup (gpu_presence.h), a GPU lost in the middle of a job is an internal
// failure: INTERNAL, logged and alerted on as one (docs/OPERATIONS.md).
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

// OK for cudaSuccess; otherwise the status of `error` met while doing `what` (`no_gpu`: see
// above; the backend's default), and the calling
// thread's last CUDA error is reset (cudaGetLastError), so that an error reported once is not
// reported again by a later, unrelated launch check on this thread (another job's plan after
// this one ran out of memory; a trainer's own kernel). A sticky error (a kernel fault) survives
// the reset and keeps failing every later call.
enum class NoGpuIs { kInternal, kFailedPrecondition };

inline absl::Status CudaStatus(cudaError_t error, absl::string_view what,
                               NoGpuIs no_gpu = NoGpuIs::kInternal) {
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
      return no_gpu == NoGpuIs::kFailedPrecondition ? absl::FailedPreconditionError(message)
                                                    : absl::InternalError(message);
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
