// Page-locked host memory (cudaHostAlloc): the one owner of it for the CUDA backend (transfer
// staging, the mapped loss queue) and the trainer library (ShardReader's device delivery,
// LossReporter::ReportFromDevice). Copies from and to it run at PCIe speed and truly
// asynchronously (cudaMemcpyAsync from pageable memory is staged and synchronous).
//
// Header-only, like cuda_status.h: it calls the CUDA runtime that the binary links (the backend
// links it statically, the trainer library dynamically).
//
// Not thread-safe: one owner. The owner makes sure no enqueued work still uses the memory when
// it is freed (Reset, Allocate, the destructor, a move onto it).
#ifndef SAMPLERD_KERNELS_CUDA_PINNED_BUFFER_H_
#define SAMPLERD_KERNELS_CUDA_PINNED_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  // Frees what it held, then allocates `bytes` (0: nothing) with cudaHostAlloc's `flags`
  // (cudaHostAllocMapped: the device reads it directly, DevicePointer). On failure it holds
  // nothing and returns CudaStatus's error for `what` ("cuda: cudaHostAlloc of <bytes> bytes for
  // <what>: ..."; `no_gpu` as there).
  absl::Status Allocate(uint64_t bytes, unsigned flags, absl::string_view what,
                        NoGpuIs no_gpu = NoGpuIs::kInternal) {
    Reset();
    if (bytes == 0) return absl::OkStatus();
    void* data = nullptr;
    if (const cudaError_t e = cudaHostAlloc(&data, bytes, flags); e != cudaSuccess) {
      return CudaStatus(e, absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ", what), no_gpu);
    }
    data_ = data;
    bytes_ = bytes;
    return absl::OkStatus();
  }

  void Reset() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  // The address of the memory for device code (cudaHostAllocMapped only).
  absl::StatusOr<void*> DevicePointer() const {
    void* device = nullptr;
    SAMPLERD_RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&device, data_, 0),
                                  "cudaHostGetDevicePointer");
    return device;
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_PINNED_BUFFER_H_
