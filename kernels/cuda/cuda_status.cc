#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The runtime also recorded `error` as this thread's last error, which the next launch check
  // on this thread (cudaGetLastError, CUB's cudaPeekAtLastError) would report again for another
  // call, e.g. another job's plan after this one ran out of memory. Reported here: cleared. A
  // sticky error (a kernel fault) survives this and keeps failing every later call.
  static_cast<void>(cudaGetLastError());
  std::string message =
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace samplerd
