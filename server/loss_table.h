// LossTable: per-sample loss statistics of one job (EMA, count, last epoch seen).
//
// One loss per sample per epoch: the first report of (epoch, index) is applied, later ones are
// duplicates (a tensor-parallel peer of the same rank, a retry, or the same index drawn twice with
// replacement). 8 bytes per sample (SampleLossStats), read by ComputeBackend::RecomputeWeights
// through View(). A job holds one only when its policy uses losses (policy.loss != NONE).
//
// Not thread-safe: its owner (Job) serialises access.
#ifndef SAMPLERD_SERVER_LOSS_TABLE_H_
#define SAMPLERD_SERVER_LOSS_TABLE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/loss_stats.h"

namespace samplerd {

class LossTable {
 public:
  // `ema_decay` in [0, 1): ema <- decay * ema + (1 - decay) * loss; the first loss sets ema.
  LossTable(uint64_t num_samples, double ema_decay);

  // Applies one (index, loss) of `epoch` unless the sample already has a loss in `epoch`.
  // Requires index < num_samples, loss finite and >= 0 (validated by the caller).
  // Returns whether the loss was applied (false: a duplicate, nothing changed).
  bool Apply(uint64_t index, float loss, uint64_t epoch) {
    SampleLossStats& s = stats_[index];
    const uint16_t marker = EpochMarker(epoch);
    if (s.last_epoch == marker) return false;
    const bool first_ever = s.count == 0;
    s.ema_loss = first_ever ? loss : decay_ * s.ema_loss + (1.0f - decay_) * loss;
    if (s.count != UINT16_MAX) ++s.count;
    s.last_epoch = marker;
    samples_seen_ += first_ever;
    return true;
  }

  // Hints the CPU to load `index`'s statistics (Apply on scattered indices is memory bound).
  void Prefetch(uint64_t index) const { __builtin_prefetch(&stats_[index], 1); }

  LossStatsView View() const { return stats_; }

  // Replaces every sample's statistics (a restored snapshot). INVALID_ARGUMENT unless
  // stats.size() == num_samples.
  absl::Status Restore(std::vector<SampleLossStats> stats);

  // Gives the statistics away (the table is empty afterwards).
  std::vector<SampleLossStats> Release() && { return std::move(stats_); }

  // Samples with at least one loss over the job's life.
  uint64_t SamplesSeen() const { return samples_seen_; }

 private:
  const float decay_;
  std::vector<SampleLossStats> stats_;
  uint64_t samples_seen_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOSS_TABLE_H_
