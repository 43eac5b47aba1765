// CUDA errors as statuses: the one conversion of the CUDA backend (compute_backend.h's error
// contract). Out of memory is RESOURCE_EXHAUSTED (the caller may retry with a smaller job or once
// memory is freed); every other error is INTERNAL. The message names what was being done and
// carries the runtime's error name and string:
//   "cuda: cudaMallocAsync of 4000000000 bytes for the weights: cudaErrorMemoryAllocation: out of
//   memory".
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_STATUS_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace samplerd {
namespace cuda {

// OK for cudaSuccess; otherwise the status of `error` met while doing `what`, and the calling
// thread's last CUDA error is reset (cudaGetLastError), so that an error reported once is not
// reported again by a later, unrelated launch check on this thread.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

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
