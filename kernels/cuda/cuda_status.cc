#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace samplerd
