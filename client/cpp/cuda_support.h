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

namespace samplerd {

// OK for cudaSuccess; otherwise INTERNAL "<what>: <cudaGetErrorName>: <cudaGetErrorString>"
// (FAILED_PRECONDITION for the errors that mean "no usable GPU here": no device, no or too old a
// driver; RESOURCE_EXHAUSTED for out of memory). For an error, the calling thread's last CUDA
// error is reset (cudaGetLastError): the status reports it, a later launch check must not.
absl::Status CudaStatus(cudaError_t error, const char* what);

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
