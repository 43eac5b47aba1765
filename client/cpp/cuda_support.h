// CUDA support shared by the trainer library's device paths (ShardReader's delivery into device
// memory, LossReporter::ReportFromDevice): the CUDA runtime's errors as absl::Status, whether a
// usable GPU is present, and pinned host buffers.
//
// The library always links the CUDA runtime; on a machine without a GPU (or driver) every device
// path fails with FAILED_PRECONDITION carrying the runtime's own message, and host paths work.
#ifndef SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_
#define SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"

namespace samplerd {

// CUDA errors as statuses by kernels/cuda/cuda_status.h, the one conversion, as a trainer needs
// them: FAILED_PRECONDITION for "no usable GPU here", RESOURCE_EXHAUSTED for out of memory,
// INTERNAL otherwise; the message "cuda: <what>: <error name>: <error string>"; the thread's
// last CUDA error reset.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  return cuda::CudaStatus(error, what, cuda::NoGpuIs::kFailedPrecondition);
}

// OK if the CUDA runtime sees at least one device; otherwise FAILED_PRECONDITION saying why (the
// runtime's message). Cheap after the first call. Tests print its message when they skip.
absl::Status GpuAvailable();

// A page-locked host buffer (cudaMallocHost), so that cudaMemcpyAsync to or from it is truly
// asynchronous. Move-only; freed in the destructor.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // `bytes` of pinned memory; the runtime's error if it cannot be had.
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_CUDA_SUPPORT_H_
