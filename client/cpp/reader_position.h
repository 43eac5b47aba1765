// ReaderPosition: where a ShardReader stands in its job (which epoch, which rank of how many, and
// the next shard position Next will return), as a value a trainer stores in its checkpoint.
//
// A trainer saves ShardReader::position() with the model after a step, and a restarted trainer
// passes it to EpochLoop::Resume (or ShardReader::Resume): reading continues exactly after the
// last index Next returned before the save. The serialised form is one line of text, versioned so
// that fields can be added:
//
//   samplerd.ReaderPosition version=3 job=train epoch=3 deal=0 rank=1 world_size=4 position=4096
//       shard_length=25000
//
// (one line; shard_length only where the writer knew it. Version 1 had no deal: read as deal 0;
// versions 1 and 2 had no shard_length: read as unknown.)
//
// Plain value type; not synchronised.
#ifndef SAMPLERD_CLIENT_CPP_READER_POSITION_H_
#define SAMPLERD_CLIENT_CPP_READER_POSITION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace samplerd {

struct ReaderPosition {
  // The version Serialize writes; Parse reads it and versions 1 and 2.
  static constexpr int kVersion = 3;

  std::string job;
  uint64_t epoch = 0;
  // The epoch's deal the shard is in (elastic world size: v1::Job::deal).
  uint32_t deal = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The shard position of the next index Next returns: the number of indices of this rank's
  // shard of `epoch` consumed so far.
  uint64_t position = 0;
  // The length of this rank's shard of `epoch` in `deal`, where the writer knew it (once the
  // epoch was opened: ShardBatch::shard_length). It tells a position at the end of its shard from
  // one short of it also after the epoch closed, when the server no longer says the shard's
  // length (client/cpp/resume_check.h). Unknown (nullopt) at the start of an epoch not yet
  // opened, and in versions 1 and 2.
  std::optional<uint64_t> shard_length;

  std::string Serialize() const;
  // The inverse of Serialize. INVALID_ARGUMENT naming the field and its value for anything else:
  // another header, another version, a missing, repeated or unknown field, a number that does
  // not parse or does not fit, an empty job, rank >= world_size, world_size = 0, position >
  // shard_length.
  static absl::StatusOr<ReaderPosition> Parse(absl::string_view text);

  // OK if this position is one of (job, rank, world_size)'s: INVALID_ARGUMENT if its job or rank
  // is another, FAILED_PRECONDITION if its world size is (the shards of another world size are
  // other positions), each naming the loading job and rank, the position's epoch and the field.
  // ShardReader::Resume and EpochLoop::Resume check so first.
  absl::Status CheckOwner(absl::string_view job, uint32_t rank, uint32_t world_size) const;

  friend bool operator==(const ReaderPosition& a, const ReaderPosition& b) {
    return a.job == b.job && a.epoch == b.epoch && a.deal == b.deal && a.rank == b.rank &&
           a.world_size == b.world_size && a.position == b.position &&
           a.shard_length == b.shard_length;
  }
  friend bool operator!=(const ReaderPosition& a, const ReaderPosition& b) { return !(a == b); }
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_READER_POSITION_H_
