// Per-sample loss statistics: what a job keeps of the reported losses (in its backend's
// BackendLossStats, compute_backend.h) and what the loss policies read to recompute the
// weights. Plain data and the one rule that applies a loss (ApplyLoss).
//
// Header-only and free of library calls, so that the CUDA kernels compile the rule too.
#ifndef SAMPLERD_KERNELS_LOSS_STATS_H_
#define SAMPLERD_KERNELS_LOSS_STATS_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SAMPLERD_LOSS_STATS_HD __host__ __device__ inline
#else
#define SAMPLERD_LOSS_STATS_HD inline
#endif

namespace samplerd {

// Loss statistics of one sample: 8 bytes, so that ingesting losses for scattered indices touches
// one cache line each and the server's state stays within 16 bytes per sample with the weights.
struct SampleLossStats {
  float ema_loss = 0;       // EMA of the reported losses (undefined if count == 0).
  uint16_t count = 0;       // Losses applied over the job's life, saturating at 65535.
  uint16_t last_epoch = 0;  // EpochMarker of the last epoch with a loss; 0 = never seen.
};

// The marker of `epoch` in SampleLossStats::last_epoch: epoch mod 65535, plus 1 (never 0). It
// tells "seen in this epoch" apart from any of the previous 65534 epochs.
SAMPLERD_LOSS_STATS_HD uint16_t EpochMarker(uint64_t epoch) {
  return static_cast<uint16_t>(epoch % 65535 + 1);
}

// Applies one loss of the epoch whose marker is `marker` to `s`, unless the sample already has
// a loss in that epoch (then nothing changes: a duplicate). `loss` finite and >= 0; `decay` in
// [0, 1): ema <- decay * ema + (1 - decay) * loss in float (no FMA contraction: the CPU and the
// device build with it off), the first loss ever sets ema. Returns whether it applied the loss.
SAMPLERD_LOSS_STATS_HD bool ApplyLoss(SampleLossStats& s, float loss, uint16_t marker,
                                      float decay) {
  if (s.last_epoch == marker) return false;
  s.ema_loss = s.count == 0 ? loss : decay * s.ema_loss + (1.0f - decay) * loss;
  if (s.count != UINT16_MAX) ++s.count;
  s.last_epoch = marker;
  return true;
}

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LOSS_STATS_H_
