// PositionSet: which positions of one rank's shard have had their loss reported in an epoch.
//
// The identity of a reported loss is (epoch, rank, shard position) (proto LossBatch.positions):
// it is the same whichever process sends it, so a retried batch or a restarted trainer's repeat
// finds its positions already here and is counted as a duplicate, while a position never
// reported is applied. One bit per position: M / 8 bytes per epoch over all ranks, allocated at
// a rank's first report.
//
// Not thread-safe: its owner (Job) serialises access.
#ifndef SAMPLERD_SERVER_POSITION_SET_H_
#define SAMPLERD_SERVER_POSITION_SET_H_

#include <cstdint>
#include <vector>

namespace samplerd {

class PositionSet {
 public:
  PositionSet() = default;

  // Bytes a set over `length` positions holds once used (for the job's memory estimate).
  static uint64_t BytesFor(uint64_t length) { return (length + 63) / 64 * sizeof(uint64_t); }

  // Whether `position` was inserted. Requires position < `length` of the first Insert, if any.
  bool Contains(uint64_t position) const {
    return !bits_.empty() && (bits_[position / 64] >> (position % 64) & 1) != 0;
  }

  // Marks `position` of a shard of `length` positions; returns whether it was new. Requires
  // position < length, and the same length on every call (the shard's).
  bool Insert(uint64_t position, uint64_t length);

  // Positions inserted.
  uint64_t count() const { return count_; }

 private:
  std::vector<uint64_t> bits_;  // Empty until the first Insert.
  uint64_t count_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_POSITION_SET_H_
