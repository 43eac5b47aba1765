#include "server/loss_table.h"

namespace samplerd {

LossTable::LossTable(uint64_t num_samples, double ema_decay)
    : decay_(static_cast<float>(ema_decay)), stats_(num_samples) {}

uint64_t LossTable::SamplesSeen() const {
  uint64_t seen = 0;
  for (const SampleLossStats& s : stats_) seen += s.count > 0;
  return seen;
}

}  // namespace samplerd
