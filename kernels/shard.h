// Shards: which plan positions each data-parallel rank serves, with the rank checked (the types
// and the arithmetic, shared with the device, are kernels/plan_math.h's). The same for every
// backend and for the server (docs/SAMPLING.md, "Shards"). Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_SHARD_H_
#define SAMPLERD_KERNELS_SHARD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/plan_math.h"  // ShardSpec, PartitionMode, UnevenMode.

namespace samplerd {

// OK if `rank` is a rank of `spec`; INVALID_ARGUMENT naming the rank and the world size
// otherwise (also for world_size == 0). The one check of a rank, for every caller.
absl::Status CheckRank(const ShardSpec& spec, uint32_t rank);

// Length of rank `rank`'s shard of a plan with `plan_length` (M) positions
// (plan_math::ShardLength). INVALID_ARGUMENT if world_size == 0 or rank >= world_size.
absl::StatusOr<uint64_t> ShardLength(uint64_t plan_length, const ShardSpec& spec, uint32_t rank);

// Plan position served at shard position `shard_pos` of rank `rank`
// (plan_math::ShardPlanPosition). Requires (not checked; the caller validated with ShardLength)
// rank < world_size and shard_pos < ShardLength(...).
// With kPad the result may be >= plan_length only before the wrap is applied: the returned value
// is already reduced modulo plan_length.
uint64_t ShardToPlanPosition(uint64_t plan_length, const ShardSpec& spec, uint32_t rank,
                             uint64_t shard_pos);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_SHARD_H_
