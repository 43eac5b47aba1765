// LossTable: per-sample loss statistics of one job in host memory (SampleLossStats: EMA, count,
// last epoch seen), N entries, applied by the one rule of loss_stats.h (ApplyLoss).
//
// One loss per sample per epoch: the first report of (epoch, index) is applied, later ones are
// duplicates (a tensor-parallel peer of the same rank, a retry, or the same index drawn twice with
// replacement). 8 bytes per sample. The CPU backend's BackendLossStats holds one (cpu_backend.h);
// the journal replays logged losses into one to derive a snapshot (server/persistence).
//
// Not thread-safe: its owner serialises access.
#ifndef SAMPLERD_KERNELS_LOSS_TABLE_H_
#define SAMPLERD_KERNELS_LOSS_TABLE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/loss_stats.h"

namespace samplerd {

class LossTable {
 public:
  // N = `num_samples`, none seen. `ema_decay` in [0, 1) (ApplyLoss).
  LossTable(uint64_t num_samples, double ema_decay);

  // Applies one (index, loss) of `epoch` unless the sample already has a loss in `epoch`.
  // Requires index < N, loss finite and >= 0 (validated by the caller).
  // Returns whether the loss was applied (false: a duplicate, nothing changed).
  bool Apply(uint64_t index, float loss, uint64_t epoch) {
    SampleLossStats& s = stats_[index];
    const bool first_ever = s.count == 0;
    if (!ApplyLoss(s, loss, EpochMarker(epoch), decay_)) return false;
    samples_seen_ += first_ever;
    return true;
  }

  // Hints the CPU to load `index`'s statistics (Apply on scattered indices is memory bound).
  void Prefetch(uint64_t index) const { __builtin_prefetch(&stats_[index], 1); }

  uint64_t size() const { return stats_.size(); }
  absl::Span<const SampleLossStats> stats() const { return stats_; }

  // Replaces every sample's statistics (a restored snapshot, a rewind): N entries, or none for
  // "no sample seen". Copied in place (no second table while it runs). INVALID_ARGUMENT for
  // another size; nothing changes then.
  absl::Status Restore(absl::Span<const SampleLossStats> stats);

  // Gives the statistics away (the table is empty afterwards).
  std::vector<SampleLossStats> Release() && { return std::move(stats_); }

  // Samples with at least one loss over the job's life.
  uint64_t SamplesSeen() const { return samples_seen_; }

 private:
  float decay_;
  std::vector<SampleLossStats> stats_;
  uint64_t samples_seen_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LOSS_TABLE_H_
