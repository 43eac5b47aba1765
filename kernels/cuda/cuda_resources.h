// Owners of CUDA resources for the CUDA backend: device memory, streams and events (pinned host
// memory: pinned_buffer.h, shared with the trainer library), each released by its destructor on
// every path (an error return included), with the allocation's failure turned into a status
// (cuda_status.h).
//
// Device memory comes from the device's default stream-ordered pool (cudaMallocAsync): the plan
// kernels' scratch does too (device_plan.h), so one pool serves everything, memory freed by one
// operation is reused by the next without a round trip to the driver (KeepPoolMemory), freeing
// never synchronises the device (cudaFree would wait for every stream of every job), and the
// pool's high-water mark measures every byte the backend uses (CudaMemoryPeaks).
//
// Not thread-safe: each object has one owner.
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_RESOURCES_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_RESOURCES_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace samplerd {
namespace cuda {

// Device memory of the current device's default pool, freed in stream order.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // Frees what it held, then allocates `bytes` (0: nothing) on `stream`: usable by work enqueued
  // on `stream` after this call (or on other streams once `stream` has reached this point).
  // RESOURCE_EXHAUSTED "cuda: cudaMallocAsync of <bytes> bytes for <what>: ..." when the device
  // has not enough free memory.
  absl::Status Allocate(uint64_t bytes, cudaStream_t stream, absl::string_view what);

  // Frees the memory after the work enqueued so far on the free stream (initially the stream of
  // Allocate). Makes the owner's device current for that.
  void Reset();

  // The stream Reset frees on. An object that outlives the operation that made it (weights, loss
  // statistics) moves its buffer to cudaStreamPerThread once that operation's stream is idle:
  // the stream goes back to its pool and may be destroyed before the buffer is.
  void set_free_stream(cudaStream_t stream) { free_stream_ = stream; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  int device_ = 0;
  cudaStream_t free_stream_ = nullptr;
};

// A stream that does not synchronise with the legacy default stream.
class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  absl::Status Create(absl::string_view what);
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing (the cheapest kind), for "has the stream reached this point".
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  absl::Status Create(absl::string_view what);
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_RESOURCES_H_
