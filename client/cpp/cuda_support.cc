#include "client/cpp/cuda_support.h"

#include <utility>

namespace samplerd {

absl::Status GpuAvailable() {
  // The runtime's answer does not change within a process.
  static const absl::Status* const available = [] {
    int count = 0;
    absl::Status s = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (s.ok() && count == 0) s = absl::FailedPreconditionError("no CUDA device is present");
    if (!s.ok()) s = absl::FailedPreconditionError(s.message());
    return new absl::Status(std::move(s));
  }();
  return *available;
}

}  // namespace samplerd
