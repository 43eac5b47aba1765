#include "kernels/shard.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/plan_math.h"

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
  // One home for the arithmetic: the host/device rule the CUDA kernels use too.
  gpu::ShardLayout layout;
  layout.world_size = spec.world_size;
  layout.interleaved = spec.partition == PartitionMode::kInterleaved;
  layout.uneven = spec.uneven == UnevenMode::kPad        ? gpu::kUnevenPad
                  : spec.uneven == UnevenMode::kDropLast ? gpu::kUnevenDropLast
                                                         : gpu::kUnevenUneven;
  return gpu::ShardPlanPosition(plan_length, layout, rank, shard_pos);
}

}  // namespace samplerd
