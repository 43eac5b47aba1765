// A rank's shard as a Job serves it, for server tests that drive a Job without gRPC.
//
// AwaitShard waits for an epoch's plan as the StreamShard reactor does (Job::OnEpochSettled, then
// Job::AcquireShard again), blocking the test's thread.
#ifndef SAMPLERD_SERVER_TESTING_JOB_SHARDS_H_
#define SAMPLERD_SERVER_TESTING_JOB_SHARDS_H_

#include <cstdint>
#include <vector>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/compute_backend.h"
#include "server/job.h"

namespace samplerd {
namespace testutil {

// Job::AcquireShard, waiting until `deadline` while the epoch is not served yet (then its
// DEADLINE_EXCEEDED).
inline absl::StatusOr<ShardLease> AwaitShard(Job& job, uint64_t epoch, uint32_t deal,
                                             uint32_t rank, uint32_t world_size,
                                             absl::Time deadline, ShardReader reader = {}) {
  for (;;) {
    absl::StatusOr<ShardLease> lease = job.AcquireShard(epoch, deal, rank, world_size, reader);
    if (!absl::IsDeadlineExceeded(lease.status()) || absl::Now() >= deadline) return lease;
    auto settled = std::make_shared<absl::Notification>();
    job.OnEpochSettled(epoch, deadline, [settled] { settled->Notify(); });
    settled->WaitForNotification();
  }
}

// Rank `rank`'s shard of `epoch` (position k at [k]) in its current deal (deal 0 for the next
// epoch), extracted with `backend`; waits up to 30 s for the epoch's plan. A failure is a test
// failure (and an empty shard).
inline std::vector<uint64_t> ShardOf(Job& job, ComputeBackend& backend, uint64_t epoch,
                                     uint32_t rank) {
  const v1::Job described = job.Describe();
  const uint32_t deal = epoch == described.current_epoch() ? described.deal() : 0;
  auto lease = AwaitShard(job, epoch, deal, rank, described.world_size(),
                          absl::Now() + absl::Seconds(30));
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
