// Per-sample loss statistics: what the server keeps of the reported losses (its LossTable owns
// them) and what the backends read to recompute the weights. Plain data.
#ifndef SAMPLERD_KERNELS_LOSS_STATS_H_
#define SAMPLERD_KERNELS_LOSS_STATS_H_

#include <cstdint>

#include "absl/types/span.h"

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
inline uint16_t EpochMarker(uint64_t epoch) { return static_cast<uint16_t>(epoch % 65535 + 1); }

// Per-sample loss statistics, N entries. Owned by the caller (the server's LossTable); backends
// only read them.
using LossStatsView = absl::Span<const SampleLossStats>;

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LOSS_STATS_H_
