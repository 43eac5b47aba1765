#include "kernels/plan_shard.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status CopyShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                       absl::Span<uint64_t> out) {
  const uint64_t m = plan.size();
  absl::StatusOr<uint64_t> length = ShardLength(m, shard, rank);
  if (!length.ok()) return length.status();
  if (start > *length || out.size() > *length - start) {
    return absl::InvalidArgumentError(absl::StrCat("shard range [", start, ", ", start + out.size(),
                                                   ") passes the shard length ", *length));
  }
  auto copy = [&](const auto& indices) {
    for (uint64_t k = 0; k < out.size(); ++k) {
      out[k] = indices[ShardToPlanPosition(m, shard, rank, start + k)];
    }
  };
  if (Plan::Narrow(plan.num_samples)) {
    copy(plan.indices32);
  } else {
    copy(plan.indices64);
  }
  return absl::OkStatus();
}

}  // namespace samplerd
