// The CUDA implementation of the trainer library's device port (device_port.h): what
// //client/cpp:trainer links. The CPU-only twin is device_port_none.cc.
#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "client/cpp/cuda_support.h"
#include "client/cpp/device_port.h"
#include "client/cpp/device_uploader.h"

namespace samplerd {
namespace device_port {

static_assert(std::is_same_v<DeviceStream, cudaStream_t>,
              "DeviceStream must be the CUDA runtime's cudaStream_t");

namespace {

class CudaUploader : public Uploader {
 public:
  explicit CudaUploader(std::unique_ptr<DeviceUploader> uploader)
      : uploader_(std::move(uploader)) {}
  absl::Status Upload(const void* src, size_t bytes, void* dst, DeviceStream stream) override {
    return uploader_->Upload(src, bytes, dst, stream);
  }

 private:
  const std::unique_ptr<DeviceUploader> uploader_;
};

// A slot: pinned host arrays the copies land in, and the event recorded behind them.
struct Slot {
  cuda::PinnedBuffer indices;  // int64 (read as uint64: the same bits).
  cuda::PinnedBuffer losses;   // float.
  cudaEvent_t landed = nullptr;
};

class CudaLossStaging : public LossStaging {
 public:
  CudaLossStaging(int device, std::vector<Slot> slots)
      : device_(device), slots_(std::move(slots)) {}
  ~CudaLossStaging() override {
    for (Slot& slot : slots_) {
      if (slot.landed != nullptr) cudaEventDestroy(slot.landed);
    }
  }

  absl::Status Enqueue(size_t id, const int64_t* d_indices, const float* d_losses, size_t n,
                       DeviceStream stream, bool* fenced) override {
    Slot& slot = slots_[id];
    absl::Status s = CudaStatus(cudaMemcpyAsync(slot.indices.data(), d_indices, n * sizeof(int64_t),
                                                cudaMemcpyDeviceToHost, stream),
                                "ReportFromDevice: cudaMemcpyAsync of d_indices");
    if (s.ok()) {
      s = CudaStatus(cudaMemcpyAsync(slot.losses.data(), d_losses, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream),
                     "ReportFromDevice: cudaMemcpyAsync of d_losses");
    }
    if (s.ok()) s = CudaStatus(cudaEventRecord(slot.landed, stream), "cudaEventRecord");
    // A copy enqueued before a failure may still write into the slot: a fence behind it lets the
    // caller wait for it before reusing the slot.
    *fenced = s.ok() || cudaEventRecord(slot.landed, stream) == cudaSuccess;
    return s;
  }

  absl::Status Await(size_t id) override {
    return CudaStatus(cudaEventSynchronize(slots_[id].landed), "ReportFromDevice: the copies");
  }

  const uint64_t* indices(size_t id) const override {
    return static_cast<const uint64_t*>(slots_[id].indices.data());
  }
  const float* losses(size_t id) const override {
    return static_cast<const float*>(slots_[id].losses.data());
  }

  void BindThread() override { cudaSetDevice(device_); }

 private:
  const int device_;
  std::vector<Slot> slots_;
};

}  // namespace

absl::Status Available() { return GpuAvailable(); }

absl::StatusOr<std::unique_ptr<Uploader>> NewUploader(int slots) {
  absl::StatusOr<std::unique_ptr<DeviceUploader>> uploader = DeviceUploader::Create(slots);
  if (!uploader.ok()) return uploader.status();
  return std::make_unique<CudaUploader>(*std::move(uploader));
}

absl::StatusOr<std::unique_ptr<LossStaging>> NewLossStaging(size_t slot_count, size_t slot_pairs) {
  if (absl::Status s = GpuAvailable(); !s.ok()) return s;
  int device = 0;
  if (absl::Status s = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  std::vector<Slot> slots(slot_count);
  // On a failure the events made so far go (the pinned buffers free themselves): a later call
  // tries again from scratch.
  auto fail = [&slots](absl::Status s) {
    for (Slot& made : slots) {
      if (made.landed != nullptr) cudaEventDestroy(made.landed);
    }
    return s;
  };
  for (Slot& slot : slots) {
    if (absl::Status s = slot.indices.Allocate(slot_pairs * sizeof(int64_t), cudaHostAllocDefault,
                                               "ReportFromDevice staging", kTrainerNoGpu);
        !s.ok()) {
      return fail(s);
    }
    if (absl::Status s = slot.losses.Allocate(slot_pairs * sizeof(float), cudaHostAllocDefault,
                                              "ReportFromDevice staging", kTrainerNoGpu);
        !s.ok()) {
      return fail(s);
    }
    // Blocking sync: the device thread sleeps in cudaEventSynchronize instead of spinning (the
    // trainer's CPU is the trainer's). Waiting on an event waits for nothing else.
    absl::Status s = CudaStatus(
        cudaEventCreateWithFlags(&slot.landed, cudaEventDisableTiming | cudaEventBlockingSync),
        "cudaEventCreateWithFlags");
    if (!s.ok()) {
      slot.landed = nullptr;
      return fail(s);
    }
  }
  return std::make_unique<CudaLossStaging>(device, std::move(slots));
}

}  // namespace device_port
}  // namespace samplerd
