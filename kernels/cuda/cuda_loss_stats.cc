#include "kernels/cuda/cuda_loss_stats.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/backend_checks.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_weights.h"

namespace samplerd {
namespace cuda {

absl::StatusOr<std::unique_ptr<CudaLossStats>> CudaLossStats::Create(
    std::shared_ptr<const CudaContext> context, uint64_t num_samples, double ema_decay) {
  SAMPLERD_RETURN_IF_ERROR(context->Enter());
  std::unique_ptr<CudaLossStats> stats(
      new CudaLossStats(std::move(context), num_samples, static_cast<float>(ema_decay)));
  SAMPLERD_RETURN_IF_ERROR(stats->stream_.Create("loss statistics"));
  const cudaStream_t stream = stats->stream_.get();
  const uint64_t bytes = gpu::LossStatsBytes(num_samples);
  SAMPLERD_RETURN_IF_ERROR(stats->stats_.Allocate(bytes, stream, "the loss statistics"));
  // All bytes 0 is every sample never seen (SampleLossStats{}, no bits).
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(stats->stats_.as<void>(), 0, bytes, stream),
                                "cudaMemsetAsync of the loss statistics");
  SAMPLERD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "clearing the loss statistics");
  // After the device allocation, which refuses an N beyond memory before this could throw.
  stats->markers_.assign(num_samples, 0);
  return stats;
}

CudaLossStats::~CudaLossStats() {
  // Nothing may still read the queue's pinned buffers when they are freed. Errors cannot be
  // returned from here (and the object is going away).
  if (context_->Enter().ok() && stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
}

absl::Status CudaLossStats::Fail(absl::Status status) const {
  if (error_.ok()) error_ = status;
  return error_;
}

absl::Status CudaLossStats::AllocateQueue() {
  for (QueueBuffer& q : queue_) {
    SAMPLERD_RETURN_IF_ERROR(
        q.indices.Allocate(kQueuePairs * sizeof(uint64_t), cudaHostAllocMapped, "the loss queue"));
    SAMPLERD_RETURN_IF_ERROR(
        q.losses.Allocate(kQueuePairs * sizeof(float), cudaHostAllocMapped, "the loss queue"));
    absl::StatusOr<void*> indices = q.indices.DevicePointer();
    if (!indices.ok()) return indices.status();
    absl::StatusOr<void*> losses = q.losses.DevicePointer();
    if (!losses.ok()) return losses.status();
    q.device_indices = static_cast<const uint64_t*>(*indices);
    q.device_losses = static_cast<const float*>(*losses);
    SAMPLERD_RETURN_IF_ERROR(q.applied.Create("the loss queue"));
  }
  return absl::OkStatus();
}

absl::Status CudaLossStats::Submit() const {
  if (queued_ == 0) return absl::OkStatus();
  SAMPLERD_RETURN_IF_ERROR(Fail(context_->Enter()));
  QueueBuffer& q = queue_[current_];
  if (const cudaError_t e = gpu::ApplyLosses(device_stats(), q.device_indices, q.device_losses,
                                             queued_, queue_marker_, decay_, stream_.get());
      e != cudaSuccess) {
    return Fail(CudaStatus(e, absl::StrCat("ApplyLosses of ", queued_, " losses")));
  }
  if (const cudaError_t e = cudaEventRecord(q.applied.get(), stream_.get()); e != cudaSuccess) {
    return Fail(CudaStatus(e, "cudaEventRecord after ApplyLosses"));
  }
  current_ ^= 1;
  queued_ = 0;
  return absl::OkStatus();
}

absl::Status CudaLossStats::Flush() const {
  if (!error_.ok()) return error_;
  SAMPLERD_RETURN_IF_ERROR(Fail(context_->Enter()));
  SAMPLERD_RETURN_IF_ERROR(Submit());
  if (const cudaError_t e = cudaStreamSynchronize(stream_.get()); e != cudaSuccess) {
    return Fail(CudaStatus(e, "applying the queued losses"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaLossStats::Apply(uint64_t epoch, absl::Span<const uint64_t> indices,
                                              absl::Span<const float> losses) {
  if (!error_.ok()) return error_;
  // Before anything changes: a caller's bug must not write outside the markers or the device's
  // statistics (and the CPU backend refuses the same way).
  if (absl::Status s = CheckApplyArguments(n_, indices, losses); !s.ok()) return s;
  SAMPLERD_RETURN_IF_ERROR(Fail(context_->Enter()));
  if (queue_[0].indices.bytes() == 0) {
    if (absl::Status s = AllocateQueue(); !s.ok()) return Fail(s);
  }
  const uint16_t marker = EpochMarker(epoch);
  // One batch, one epoch (its indices are then distinct, and ApplyLosses takes one marker).
  if (queued_ > 0 && marker != queue_marker_) {
    if (absl::Status s = Submit(); !s.ok()) return s;
  }
  uint64_t applied = 0;
  for (size_t k = 0; k < indices.size(); ++k) {
    const uint64_t i = indices[k];
    uint16_t& last = markers_[i];
    if (last == marker) continue;  // A loss of this epoch came first.
    bool seen_before = last != 0;
    if (!seen_exceptions_.empty() && seen_exceptions_.erase(i) > 0) seen_before = !seen_before;
    seen_ += !seen_before;
    last = marker;
    if (queued_ == kQueuePairs) {
      if (absl::Status s = Submit(); !s.ok()) return s;
    }
    QueueBuffer& q = queue_[current_];
    if (queued_ == 0) {
      // The device may still read this buffer's previous batch (submitted two batches ago).
      if (const cudaError_t e = cudaEventSynchronize(q.applied.get()); e != cudaSuccess) {
        return Fail(CudaStatus(e, "applying queued losses"));
      }
      queue_marker_ = marker;
    }
    q.indices.as<uint64_t>()[queued_] = i;
    q.losses.as<float>()[queued_] = losses[k];
    ++queued_;
    ++applied;
  }
  return applied;
}

absl::StatusOr<std::vector<SampleLossStats>> CudaLossStats::ToHost() const {
  SAMPLERD_RETURN_IF_ERROR(Flush());  // Enters the backend's device.
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::to_host);
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  std::vector<SampleLossStats> host(n_);
  // The device's arrays joined into SampleLossStats a piece at a time (host memory: the result
  // and one piece of each array).
  const gpu::DeviceLossStats device = device_stats();
  const uint64_t piece = std::min(n_, kTransferSamples);
  std::vector<float> ema(piece);
  std::vector<uint32_t> meta(piece);
  for (uint64_t first = 0; first < n_; first += piece) {
    const uint64_t count = std::min(piece, n_ - first);
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToHost(ema.data(), device.ema + first,
                                                 count * sizeof(float), "the loss EMAs"));
    SAMPLERD_RETURN_IF_ERROR((*lane)->CopyToHost(meta.data(), device.meta + first,
                                                 count * sizeof(uint32_t), "the loss counts"));
    gpu::JoinLossStats(ema.data(), meta.data(), count, host.data() + first);
  }
  return host;
}

absl::Status CudaLossStats::Restore(absl::Span<const SampleLossStats> stats) {
  if (!error_.ok()) return error_;
  if (!stats.empty() && stats.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss statistics: ", stats.size(), " entries for num_samples ", n_));
  }
  // Queued pairs would land after the upload (another stream): apply them first.
  SAMPLERD_RETURN_IF_ERROR(Flush());
  const CudaContext::OperationScope scope(context_.get(), &CudaMemoryPeaks::restore);
  absl::StatusOr<CudaContext::LaneLease> lane = context_->AcquireLane();
  if (!lane.ok()) return lane.status();
  // From here on a failure leaves the device statistics unknown: it is sticky.
  if (stats.empty()) {
    if (const cudaError_t e =
            cudaMemsetAsync(stats_.as<void>(), 0, gpu::LossStatsBytes(n_), (*lane)->stream());
        e != cudaSuccess) {
      return Fail(CudaStatus(e, "cudaMemsetAsync of the loss statistics"));
    }
    if (absl::Status s = (*lane)->Synchronize("clearing the loss statistics"); !s.ok()) {
      return Fail(s);
    }
  } else {
    // Split into the device's arrays a piece at a time (a multiple of 32 samples: each piece
    // owns its bit words whole).
    const gpu::DeviceLossStats device = device_stats();
    const uint64_t piece = std::min(n_, kTransferSamples);
    std::vector<float> ema(piece);
    std::vector<uint32_t> meta(piece), seen(gpu::LossStatsWords(piece)),
        defined(gpu::LossStatsWords(piece));
    for (uint64_t first = 0; first < n_; first += piece) {
      const uint64_t count = std::min(piece, n_ - first);
      const uint64_t words = gpu::LossStatsWords(count);
      gpu::SplitLossStats(stats.data() + first, count, ema.data(), meta.data(), seen.data(),
                          defined.data());
      absl::Status s = (*lane)->CopyToDevice(device.ema + first, ema.data(), count * sizeof(float),
                                             "the loss EMAs");
      if (s.ok()) {
        s = (*lane)->CopyToDevice(device.meta + first, meta.data(), count * sizeof(uint32_t),
                                  "the loss counts");
      }
      if (s.ok()) {
        s = (*lane)->CopyToDevice(device.seen + first / 32, seen.data(), words * sizeof(uint32_t),
                                  "the loss bits");
      }
      if (s.ok()) {
        s = (*lane)->CopyToDevice(device.defined + first / 32, defined.data(),
                                  words * sizeof(uint32_t), "the loss bits");
      }
      if (!s.ok()) return Fail(s);
    }
  }
  seen_ = 0;
  seen_exceptions_.clear();
  for (uint64_t i = 0; i < n_; ++i) {
    const SampleLossStats s = stats.empty() ? SampleLossStats() : stats[i];
    markers_[i] = s.last_epoch;
    seen_ += s.count > 0;
    if ((s.count > 0) != (s.last_epoch != 0)) seen_exceptions_.insert(i);
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace samplerd
