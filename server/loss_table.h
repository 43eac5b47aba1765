// LossTable: per-sample loss statistics of one job (EMA, count, last epoch seen).
//
// Structure of arrays, 12 bytes per sample, read by ComputeBackend::RecomputeWeights through
// View(). Not thread-safe: its owner (Job) serialises access.
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
    const float d = decay_;
    const bool first = count_[index] == 0;
    ema_[index] = first ? loss : d * ema_[index] + (1.0f - d) * loss;
    if (count_[index] != UINT32_MAX) ++count_[index];
    last_epoch_[index] = static_cast<uint32_t>(epoch + 1);
    return first;
  }

  LossStatsView View() const { return LossStatsView{ema_, count_, last_epoch_}; }

  // Samples with at least one loss.
  uint64_t SamplesSeen() const;

 private:
  const float decay_;
  std::vector<float> ema_;
  std::vector<uint32_t> count_;
  std::vector<uint32_t> last_epoch_;  // Epoch + 1 of the last loss; 0 = never.
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOSS_TABLE_H_
