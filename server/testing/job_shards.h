// A rank's shard as a Job serves it, for server tests that drive a Job without gRPC.
#ifndef SAMPLERD_SERVER_TESTING_JOB_SHARDS_H_
#define SAMPLERD_SERVER_TESTING_JOB_SHARDS_H_

#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/compute_backend.h"
#include "server/job.h"

namespace samplerd {
namespace testutil {

// Rank `rank`'s shard of `epoch` (position k at [k]) in its current deal (deal 0 for the next
// epoch), extracted with `backend`; waits up to 30 s for the epoch's plan. A failure is a test
// failure (and an empty shard).
inline std::vector<uint64_t> ShardOf(Job& job, ComputeBackend& backend, uint64_t epoch,
                                     uint32_t rank) {
  const v1::Job described = job.Describe();
  const uint32_t deal = epoch == described.current_epoch() ? described.deal() : 0;
  auto lease =
      job.AcquireShard(epoch, deal, rank, described.world_size(), absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(lease.ok()) << lease.status();
  if (!lease.ok()) return {};
  std::vector<uint64_t> out(lease->shard_length);
  EXPECT_TRUE(
      backend.ExtractShard(*lease->view.plan, lease->shard, rank, 0, absl::MakeSpan(out)).ok());
  return out;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_JOB_SHARDS_H_
