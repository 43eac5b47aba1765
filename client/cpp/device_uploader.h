// DeviceUploader: copies host arrays into device memory the caller owns, asynchronously on a CUDA
// stream the caller gives, through page-locked staging buffers, without ever synchronising that
// stream.
//
// Why staging: cudaMemcpyAsync from pageable memory is synchronous with respect to the host (the
// driver copies through its own bounce buffer first), and the source (a ShardReader's queue) is
// reused as soon as the call returns. Each Upload copies the data into one of `slots` pinned
// buffers, enqueues the copy to the device on the caller's stream and records an event behind it;
// a slot is reused only once its event has completed, i.e. once the device has read it. Upload
// waits (on the host, for that event only) when all slots still have a copy in flight: the
// caller is then `slots` uploads ahead of its stream, and the wait is the back-pressure.
//
// Lifetimes: the destination must stay valid until the copy has run on the stream (the caller's
// usual rule for its own stream work). The destructor waits for the copies still in flight, since
// freeing a staging buffer the device is reading would corrupt the copy.
//
// Thread-compatible: one thread at a time (a trainer's rank thread). Every call must be made with
// the device that owns the stream and the destination current (cudaSetDevice), as for any CUDA
// runtime call on that stream.
#ifndef SAMPLERD_CLIENT_CPP_DEVICE_UPLOADER_H_
#define SAMPLERD_CLIENT_CPP_DEVICE_UPLOADER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/cuda_support.h"

namespace samplerd {

class DeviceUploader {
 public:
  // `slots` staging buffers (>= 1; 2-4 let the host run that many uploads ahead of the stream).
  // Buffers are allocated on first use and grown to the largest upload. FAILED_PRECONDITION
  // (GpuAvailable's message) without a usable GPU; INVALID_ARGUMENT for slots < 1.
  static absl::StatusOr<std::unique_ptr<DeviceUploader>> Create(int slots = 3);
  ~DeviceUploader();
  DeviceUploader(const DeviceUploader&) = delete;
  DeviceUploader& operator=(const DeviceUploader&) = delete;

  // Copies `bytes` from host memory `src` (any kind; free to reuse when this returns) to device
  // memory `dst` on `stream` (0 is the legacy default stream). Returns once the copy is enqueued.
  // The CUDA runtime's error (CudaStatus) if staging or enqueueing fails; nothing is enqueued then.
  absl::Status Upload(const void* src, size_t bytes, void* dst, cudaStream_t stream);

 private:
  struct Slot {
    cuda::PinnedBuffer buffer;
    cudaEvent_t done = nullptr;  // Recorded behind the slot's last copy; null before the first.
    bool in_flight = false;      // `done` was recorded and not yet waited for.
  };

  explicit DeviceUploader(int slots) : slots_(slots) {}

  std::vector<Slot> slots_;
  size_t next_slot_ = 0;  // Round robin: the slot whose copy is the oldest.
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_DEVICE_UPLOADER_H_
