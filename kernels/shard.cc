#include "kernels/shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status CheckRank(const ShardSpec& spec, uint32_t rank) {
  if (spec.world_size == 0) {
    return absl::InvalidArgumentError("world_size = 0: must be >= 1");
  }
  if (rank >= spec.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " is outside [0, world_size = ", spec.world_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardLength(uint64_t plan_length, const ShardSpec& spec, uint32_t rank) {
  if (absl::Status s = CheckRank(spec, rank); !s.ok()) return s;
  const uint64_t r = spec.world_size;
  switch (spec.uneven) {
    case UnevenMode::kPad:
      return (plan_length + r - 1) / r;
    case UnevenMode::kDropLast:
      return plan_length / r;
    case UnevenMode::kUneven:
      return plan_length / r + (rank < plan_length % r ? 1 : 0);
  }
  return absl::InvalidArgumentError("uneven: unknown mode");
}

uint64_t ShardToPlanPosition(uint64_t plan_length, const ShardSpec& spec, uint32_t rank,
                             uint64_t shard_pos) {
  const uint64_t r = spec.world_size;
  uint64_t p;
  if (spec.partition == PartitionMode::kInterleaved) {
    p = rank + shard_pos * r;
  } else if (spec.uneven == UnevenMode::kUneven) {
    const uint64_t base = plan_length / r, extra = plan_length % r;
    p = rank * base + std::min<uint64_t>(rank, extra) + shard_pos;
  } else {
    const uint64_t len =
        spec.uneven == UnevenMode::kPad ? (plan_length + r - 1) / r : plan_length / r;
    p = rank * len + shard_pos;
  }
  // Only kPad reaches past the plan; it wraps around like DistributedSampler's padding.
  return p < plan_length ? p : p % plan_length;
}

}  // namespace samplerd
