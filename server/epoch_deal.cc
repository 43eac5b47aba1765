#include "server/epoch_deal.h"

#include <vector>

#include "glog/logging.h"

namespace samplerd {

Plan RemainingPlan(const Plan& plan, const ShardSpec& shard, absl::Span<const RankDone> ranks) {
  CHECK_EQ(ranks.size(), shard.world_size);
  const uint64_t m = plan.size();
  // Bit q of `served`: some shard position serves plan position q; of `done`: q is done.
  std::vector<bool> served(m), done(m);
  for (uint32_t r = 0; r < shard.world_size; ++r) {
    const uint64_t length = *ShardLength(m, shard, r);  // r < world_size: cannot fail.
    for (uint64_t s = 0; s < length; ++s) {
      const uint64_t q = ShardToPlanPosition(m, shard, r, s);
      served[q] = true;
      if (ranks[r].ended || ranks[r].reported->Contains(s)) done[q] = true;
    }
  }
  Plan remaining;
  remaining.epoch = plan.epoch;
  remaining.num_samples = plan.num_samples;
  auto keep = [&](auto& out) {
    for (uint64_t q = 0; q < m; ++q) {
      if (served[q] && !done[q]) out.push_back(plan[q]);
    }
  };
  if (Plan::Narrow(plan.num_samples)) {
    keep(remaining.indices32);
  } else {
    keep(remaining.indices64);
  }
  return remaining;
}

}  // namespace samplerd
