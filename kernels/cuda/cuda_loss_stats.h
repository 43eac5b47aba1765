// CudaLossStats: BackendLossStats with the N samples' statistics in device memory, as
// gpu::DeviceLossStats (device_weights.h: the EMAs, the counts and markers, and two bits per
// sample; ~8.25 B per sample), made by the CUDA backend (cuda_backend.h).
//
// Apply decides on the host, at the call, which losses apply: a 2-byte epoch marker per sample
// (markers_) answers "has this sample a loss in this epoch" without touching the device, so the
// call returns the applied count at once and the arrival-order rule of docs/SAMPLING.md (the
// first loss of a sample in an epoch wins) holds whatever the device does later. The applied
// (index, loss) pairs go into a pinned queue that the device reads directly (mapped memory):
// when a queue buffer is full (or the epoch changes) gpu::ApplyLosses is enqueued on the
// object's stream for it and the other buffer takes the next pairs, so Apply never waits for the
// batch it just submitted, only (rarely) for the one before it. Flush enqueues what is queued and
// waits; everything that reads the statistics flushes first (ToHost, Restore, RecomputeWeights).
//
// Invariant (what makes the host decision the device's): for every sample i whose pairs have
// all been applied on the device, markers_[i] == its last_epoch on the device; a sample
// with a pair in the queue has markers_[i] == the marker of its newest queued pair, and the
// device reaches the same value once the stream applies the queue (pairs of one sample are
// enqueued in order on one stream; one queue batch holds one epoch, so its indices are
// distinct, as ApplyLosses requires). SamplesSeen is counted on the host from the same
// decision: a sample's first applied loss ever is its first with a zero marker (or, for samples
// restored with count > 0 but last_epoch == 0 and the reverse, the CPU's rule count == 0: kept
// in a small exception set).
//
// A device error (a failed launch, a lost device) is sticky: every later call returns it.
// Not thread-safe (BackendLossStats' contract: its owner serialises calls).
#ifndef SAMPLERD_KERNELS_CUDA_CUDA_LOSS_STATS_H_
#define SAMPLERD_KERNELS_CUDA_CUDA_LOSS_STATS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/compute_backend.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/pinned_buffer.h"

namespace samplerd {
namespace cuda {

class CudaLossStats final : public BackendLossStats {
 public:
  // Pairs per queue buffer (12 B each: index and loss): a kernel launch per 256 Ki losses.
  static constexpr uint64_t kQueuePairs = uint64_t{1} << 18;
  // Samples per piece of ToHost and Restore (a multiple of 32: whole bit words): 8 MiB of host
  // arrays.
  static constexpr uint64_t kTransferSamples = uint64_t{1} << 20;

  // N >= 1 samples, none seen; `ema_decay` in [0, 1) (checked by the backend).
  static absl::StatusOr<std::unique_ptr<CudaLossStats>> Create(
      std::shared_ptr<const CudaContext> context, uint64_t num_samples, double ema_decay);
  ~CudaLossStats() override;

  uint64_t size() const override { return n_; }
  absl::StatusOr<uint64_t> Apply(uint64_t epoch, absl::Span<const uint64_t> indices,
                                 absl::Span<const float> losses) override;
  uint64_t SamplesSeen() const override { return seen_; }
  absl::StatusOr<std::vector<SampleLossStats>> ToHost() const override;
  absl::Status Restore(absl::Span<const SampleLossStats> stats) override;

  // Applies every queued pair and waits until the device statistics hold them all; then
  // device_stats() may be read by any stream. The sticky error if there is one.
  absl::Status Flush() const;
  gpu::DeviceLossStats device_stats() const { return gpu::LossStatsIn(stats_.as<void>(), n_); }

 private:
  CudaLossStats(std::shared_ptr<const CudaContext> context, uint64_t n, float decay)
      : context_(std::move(context)), n_(n), decay_(decay) {}

  // One buffer of the queue: pinned, mapped for the device.
  struct QueueBuffer {
    PinnedBuffer indices, losses;
    const uint64_t* device_indices = nullptr;
    const float* device_losses = nullptr;
    Event applied;  // The device has read this buffer once it completed.
  };

  absl::Status AllocateQueue();
  // Enqueues ApplyLosses for the current buffer's pairs and switches buffers.
  absl::Status Submit() const;
  // Records `status` as the sticky error and returns it.
  absl::Status Fail(absl::Status status) const;

  const std::shared_ptr<const CudaContext> context_;
  const uint64_t n_;
  const float decay_;
  Stream stream_;  // Declared before stats_: destroyed after it (its free is enqueued here).
  DeviceBuffer stats_;
  std::vector<uint16_t> markers_;  // The host's copy of every sample's last_epoch (see above).
  uint64_t seen_ = 0;
  // Samples restored with (count > 0) != (last_epoch != 0), not applied since: their "seen"
  // is the CPU's count > 0, not the marker's.
  absl::flat_hash_set<uint64_t> seen_exceptions_;

  mutable QueueBuffer queue_[2];
  mutable int current_ = 0;            // The buffer taking pairs.
  mutable uint64_t queued_ = 0;        // Pairs in it.
  mutable uint16_t queue_marker_ = 0;  // Their epoch's marker.
  mutable absl::Status error_;
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_CUDA_LOSS_STATS_H_
