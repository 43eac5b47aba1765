// A rank's shard of a host plan: ComputeBackend::ExtractShard for every backend whose plans are
// host Plans (the CPU's and CUDA's), over the shard arithmetic of shard.h.
#ifndef SAMPLERD_KERNELS_PLAN_SHARD_H_
#define SAMPLERD_KERNELS_PLAN_SHARD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/plan.h"
#include "kernels/shard.h"

namespace samplerd {

// Copies rank `rank`'s shard positions [start, start + out.size()) of `plan` into `out`:
// out[k] = plan[ShardToPlanPosition(M, shard, rank, start + k)]. INVALID_ARGUMENT (and `out`
// untouched) if the rank is not one of `shard` (CheckRank) or the range passes the shard's end
// ("shard range [5, 12) passes the shard length 10"). Thread-safe (reads the plan only).
absl::Status CopyShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                       absl::Span<uint64_t> out);

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_PLAN_SHARD_H_
