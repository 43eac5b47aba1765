#include "kernels/cuda/cuda_resources.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    free_stream_ = other.free_stream_;
  }
  return *this;
}

absl::Status DeviceBuffer::Allocate(uint64_t bytes, cudaStream_t stream, absl::string_view what) {
  Reset();
  if (bytes == 0) return absl::OkStatus();
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device_), "cudaGetDevice");
  void* data = nullptr;
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaMallocAsync(&data, bytes, stream),
                                absl::StrCat("cudaMallocAsync of ", bytes, " bytes for ", what));
  data_ = data;
  bytes_ = bytes;
  free_stream_ = stream;
  return absl::OkStatus();
}

void DeviceBuffer::Reset() {
  if (data_ == nullptr) return;
  // The pool and the free stream belong to device_; the calling thread may have another device
  // current (the runtime's current device is per thread). An error here cannot be returned from
  // a destructor; it is sticky and the next call of the owner's backend reports it.
  // The caller's current device is put back afterwards.
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  cudaFreeAsync(data_, free_stream_);
  if (switched) cudaSetDevice(current);
  data_ = nullptr;
  bytes_ = 0;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status Stream::Create(absl::string_view what) {
  cudaStream_t stream = nullptr;
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                absl::StrCat("cudaStreamCreateWithFlags for ", what));
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = stream;
  return absl::OkStatus();
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status Event::Create(absl::string_view what) {
  cudaEvent_t event = nullptr;
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                absl::StrCat("cudaEventCreateWithFlags for ", what));
  if (event_ != nullptr) cudaEventDestroy(event_);
  event_ = event;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace samplerd
