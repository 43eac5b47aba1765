#include "server/loss_table.h"

namespace samplerd {

LossTable::LossTable(uint64_t num_samples, double ema_decay)
    : decay_(static_cast<float>(ema_decay)),
      ema_(num_samples, 0.0f),
      count_(num_samples, 0),
      last_epoch_(num_samples, 0) {}

uint64_t LossTable::SamplesSeen() const {
  uint64_t seen = 0;
  for (uint32_t c : count_) seen += c > 0;
  return seen;
}

}  // namespace samplerd
