#include "kernels/loss_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace samplerd {

LossTable::LossTable(uint64_t num_samples, double ema_decay)
    : decay_(static_cast<float>(ema_decay)), stats_(num_samples) {}

absl::Status LossTable::Restore(absl::Span<const SampleLossStats> stats) {
  if (stats.empty()) {  // No sample seen.
    std::fill(stats_.begin(), stats_.end(), SampleLossStats{});
    samples_seen_ = 0;
    return absl::OkStatus();
  }
  if (stats.size() != stats_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("loss statistics: ", stats.size(),
                                                   " entries for num_samples ", stats_.size()));
  }
  std::copy(stats.begin(), stats.end(), stats_.begin());
  samples_seen_ = 0;
  for (const SampleLossStats& s : stats_) samples_seen_ += s.count > 0;
  return absl::OkStatus();
}

}  // namespace samplerd
