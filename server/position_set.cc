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

uint64_t PositionSet::FirstMissing(uint64_t length) const {
  for (uint64_t w = 0; w < bits_.size(); ++w) {
    if (bits_[w] != ~uint64_t{0}) {
      const uint64_t position = w * 64 + __builtin_ctzll(~bits_[w]);
      return position < length ? position : length;
    }
  }
  return bits_.empty() ? 0 : length;
}

}  // namespace samplerd
