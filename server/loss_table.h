// LossTable: per-sample loss statistics of one job (EMA, count, last epoch seen).
//
// 12 bytes per sample (SampleLossStats: one cache line each), read by
// ComputeBackend::RecomputeWeights through View(). Not thread-safe: its owner (Job) serialises
// access.
#ifndef SAMPLERD_SERVER_LOSS_TABLE_H_
#define SAMPLERD_SERVER_LOSS_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/compute_backend.h"

namespace samplerd {

class LossTable {
 public:
  // `ema_decay` in [0, 1): ema <- decay * ema + (1 - decay) * loss; the first loss sets ema.
  LossTable(uint64_t num_samples, double ema_decay);

  // Applies one (index, loss) of `epoch`. Requires index < num_samples, loss finite and >= 0
  // (validated by the caller). Returns true if this was the sample's first loss.
  bool Apply(uint64_t index, float loss, uint64_t epoch) {
    SampleLossStats& s = stats_[index];
    const bool first = s.count == 0;
    s.ema_loss = first ? loss : decay_ * s.ema_loss + (1.0f - decay_) * loss;
    if (s.count != UINT32_MAX) ++s.count;
    s.last_epoch = static_cast<uint32_t>(epoch + 1);
    return first;
  }

  // Hints the CPU to load `index`'s statistics (Apply on scattered indices is memory bound).
  void Prefetch(uint64_t index) const { __builtin_prefetch(&stats_[index], 1); }

  LossStatsView View() const { return stats_; }

  // Samples with at least one loss.
  uint64_t SamplesSeen() const;

 private:
  const float decay_;
  std::vector<SampleLossStats> stats_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOSS_TABLE_H_
