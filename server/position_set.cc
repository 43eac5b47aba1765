#include "server/position_set.h"

namespace samplerd {

bool PositionSet::Insert(uint64_t position, uint64_t length) {
  if (bits_.empty()) bits_.assign((length + 63) / 64, 0);
  uint64_t& word = bits_[position / 64];
  const uint64_t bit = uint64_t{1} << (position % 64);
  if ((word & bit) != 0) return false;
  word |= bit;
  ++count_;
  return true;
}

}  // namespace samplerd
