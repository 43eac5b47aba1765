#include "kernels/loss_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace samplerd {

LossTable::LossTable(uint64_t num_samples, double ema_decay)
    : decay_(static_cast<float>(ema_decay)), stats_(num_samples) {}

absl::Status LossTable::Restore(std::vector<SampleLossStats> stats) {
  if (stats.empty()) stats.resize(stats_.size());  // No sample seen.
  if (stats.size() != stats_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("loss statistics: ", stats.size(),
                                                   " entries for num_samples ", stats_.size()));
  }
  stats_ = std::move(stats);
  samples_seen_ = 0;
  for (const SampleLossStats& s : stats_) samples_seen_ += s.count > 0;
  return absl::OkStatus();
}

}  // namespace samplerd
