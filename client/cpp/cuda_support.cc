#include "client/cpp/cuda_support.h"

#include <utility>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  if (absl::Status s = CudaStatus(cudaMallocHost(&buffer.data_, bytes),
                                  absl::StrCat("cudaMallocHost(", bytes, " bytes)").c_str());
      !s.ok()) {
    return s;
  }
  buffer.size_ = bytes;
  return buffer;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

}  // namespace samplerd
