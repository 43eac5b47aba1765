// CudaContext: what a CUDA backend and the objects it makes (weights, loss statistics) share:
// the device, a pool of lanes for the calls in flight, and the device memory high-water marks of
// the operations (CudaMemoryPeaks of cuda_backend.h).
//
// A lane is a stream with two pinned staging buffers: one call holds one lane from start to end,
// so concurrent calls run on different streams (no global synchronisation: a call waits for its
// own stream only) and reuse staging memory instead of pinning host memory per call. Lanes are
// made on demand (as many as calls ever ran at once) and kept for reuse.
//
// Thread-safe.
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_CONTEXT_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_CONTEXT_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/pinned_buffer.h"

namespace samplerd {
namespace cuda {

// Bytes of each of a lane's two pinned staging buffers: large enough that a transfer runs at
// PCIe speed (each chunk's DMA overlaps the host copy of the previous one), small enough that a
// lane costs 16 MiB of host memory.
inline constexpr uint64_t kStagingBytes = uint64_t{8} << 20;

class Lane {
 public:
  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  absl::Status Create();
  cudaStream_t stream() const { return stream_.get(); }

  // Waits for the work enqueued on the stream; the error of any of it.
  absl::Status Synchronize(absl::string_view what);

  // Copies `bytes` from device memory `src` to host memory `dst` (pageable: a vector's data)
  // after the work already enqueued on the stream, through the staging buffers, and returns
  // when it is complete.
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes, absl::string_view what);

  // Copies `bytes` from host memory `src` to device memory `dst`, through the staging buffers;
  // complete when it returns (so `src` may go away).
  absl::Status CopyToDevice(void* dst, const void* src, uint64_t bytes, absl::string_view what);

 private:
  // The staging buffers, allocated on the first transfer (a lane that only launches kernels
  // needs none).
  absl::Status EnsureStaging();

  Stream stream_;
  PinnedBuffer staging_[2];
  Event staged_[2];  // The stream has finished with staging_[i] when staged_[i] completed.
};

class CudaContext {
 public:
  // For `device`, already checked usable (gpu_presence.h).
  static absl::StatusOr<std::shared_ptr<CudaContext>> Create(int device);

  int device() const { return device_; }

  // Makes the device current in the calling thread (the runtime's current device is per thread:
  // any server thread may call). Every entry point of the backend's objects calls it first.
  absl::Status Enter() const;

  // A lane held for one call: back to the pool when destroyed, after its stream finished
  // everything the call enqueued (also on error paths: nothing of the call stays in flight).
  class LaneLease {
   public:
    LaneLease(LaneLease&& other) noexcept
        : context_(other.context_), lane_(std::move(other.lane_)) {}
    LaneLease(const LaneLease&) = delete;
    LaneLease& operator=(const LaneLease&) = delete;
    LaneLease& operator=(LaneLease&&) = delete;
    ~LaneLease();

    Lane* operator->() const { return lane_.get(); }
    Lane& operator*() const { return *lane_; }

   private:
    friend class CudaContext;
    LaneLease(const CudaContext* context, std::unique_ptr<Lane> lane)
        : context_(context), lane_(std::move(lane)) {}

    const CudaContext* context_;
    std::unique_ptr<Lane> lane_;
  };

  // A lane from the pool, or a new one.
  absl::StatusOr<LaneLease> AcquireLane() const ABSL_LOCKS_EXCLUDED(mu_);

  // Records the device memory peak of one operation into the field `peak` of the peaks: the
  // default pool's high-water mark while the scope is alive. The mark is reset when a scope
  // opens while no other is open; with operations in flight at once the figure is the peak of
  // all of them together (an upper bound of each one's).
  class OperationScope {
   public:
    OperationScope(const CudaContext* context, uint64_t CudaMemoryPeaks::*peak);
    OperationScope(const OperationScope&) = delete;
    OperationScope& operator=(const OperationScope&) = delete;
    ~OperationScope();

   private:
    const CudaContext* context_;
    uint64_t CudaMemoryPeaks::*peak_;
  };

  // The peaks recorded so far and the pool's memory in use now; `reset`: start over.
  CudaMemoryPeaks Peaks(bool reset) const ABSL_LOCKS_EXCLUDED(peaks_mu_);

 private:
  explicit CudaContext(int device, cudaMemPool_t pool) : device_(device), pool_(pool) {}

  void Release(std::unique_ptr<Lane> lane) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t PoolAttribute(cudaMemPoolAttr attribute) const;

  const int device_;
  const cudaMemPool_t pool_;  // The device's default pool: every allocation of the backend.

  // Lanes kept for reuse beyond this many are destroyed when released.
  static constexpr size_t kMaxIdleLanes = 16;
  mutable absl::Mutex mu_;
  mutable std::vector<std::unique_ptr<Lane>> idle_ ABSL_GUARDED_BY(mu_);

  mutable std::atomic<int> open_scopes_{0};
  mutable absl::Mutex peaks_mu_;
  mutable CudaMemoryPeaks peaks_ ABSL_GUARDED_BY(peaks_mu_);
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_CONTEXT_H_
