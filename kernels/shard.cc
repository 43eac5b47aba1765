#include "kernels/shard.h"

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
  if (spec.uneven != UnevenMode::kPad && spec.uneven != UnevenMode::kDropLast &&
      spec.uneven != UnevenMode::kUneven) {
    return absl::InvalidArgumentError("uneven: unknown mode");
  }
  return plan_math::ShardLength(plan_length, spec, rank);
}

uint64_t ShardToPlanPosition(uint64_t plan_length, const ShardSpec& spec, uint32_t rank,
                             uint64_t shard_pos) {
  return plan_math::ShardPlanPosition(plan_length, spec, rank, shard_pos);
}

}  // namespace samplerd
