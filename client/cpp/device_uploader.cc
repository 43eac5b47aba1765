#include "client/cpp/device_uploader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<DeviceUploader>> DeviceUploader::Create(int slots) {
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots = ", slots, ": must be >= 1"));
  }
  if (absl::Status s = GpuAvailable(); !s.ok()) return s;
  return std::unique_ptr<DeviceUploader>(new DeviceUploader(slots));
}

DeviceUploader::~DeviceUploader() {
  for (Slot& slot : slots_) {
    if (slot.done == nullptr) continue;
    // The device may still be reading the slot's buffer (freed right after).
    if (slot.in_flight) cudaEventSynchronize(slot.done);
    cudaEventDestroy(slot.done);
  }
}

absl::Status DeviceUploader::Upload(const void* src, size_t bytes, void* dst, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  Slot& slot = slots_[next_slot_];
  if (slot.done == nullptr) {
    // Timing off: the cheapest event to record and query.
    if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming),
                                    "cudaEventCreateWithFlags");
        !s.ok()) {
      slot.done = nullptr;
      return s;
    }
  }
  if (slot.in_flight) {
    // Waits for this slot's previous copy only: a host wait on an event never stalls the stream.
    if (absl::Status s = CudaStatus(cudaEventSynchronize(slot.done), "cudaEventSynchronize");
        !s.ok()) {
      return s;
    }
    slot.in_flight = false;
  }
  if (slot.buffer.bytes() < bytes) {
    // Frees the small one before asking for the large one.
    if (absl::Status s =
            slot.buffer.Allocate(bytes, cudaHostAllocDefault, "upload staging", kTrainerNoGpu);
        !s.ok()) {
      return s;
    }
  }
  std::memcpy(slot.buffer.data(), src, bytes);
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(dst, slot.buffer.data(), bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(host to device)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaEventRecord(slot.done, stream), "cudaEventRecord"); !s.ok()) {
    // The copy is enqueued but unguarded: wait for it here rather than reuse the buffer early.
    cudaStreamSynchronize(stream);
    return s;
  }
  slot.in_flight = true;
  next_slot_ = (next_slot_ + 1) % slots_.size();
  return absl::OkStatus();
}

}  // namespace samplerd
