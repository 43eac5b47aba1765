// Deals: how an epoch's plan positions are dealt to the ranks of a data-parallel group whose
// size changes (proto ResizeJob; "Elastic world size" in proto/samplerd.proto).
//
// Deal 0 of an epoch deals the epoch's plan to its ranks by the shard rules (ShardLength,
// ShardToPlanPosition). When the group is resized in the middle of the epoch, the next deal
// deals what the current one has not done yet: its "plan" is the subsequence of the current
// deal's plan at the positions that no rank has done, in plan order, and the same shard rules
// deal it to the new world size (so padding or dropping follows the job's uneven policy again).
// A position is done when a loss was reported for it at any shard position that serves it, or
// when a rank serving it ended the epoch (that rank consumed its whole shard). Positions that no
// shard serves (the tail DROP_LAST drops) stay undealt, as they were.
//
// Pure functions over plain data; the Job holds the deal and its lock.
#ifndef SAMPLERD_SERVER_EPOCH_DEAL_H_
#define SAMPLERD_SERVER_EPOCH_DEAL_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/plan.h"
#include "kernels/shard.h"
#include "server/position_set.h"

namespace samplerd {

// What one rank of a deal has done in the epoch.
struct RankDone {
  const PositionSet* reported = nullptr;  // Shard positions with a reported loss; may be empty.
  bool ended = false;                     // The rank ended the epoch.
};

// The plan of the next deal: the entries of `plan` (the current deal's, dealt to `shard`) at
// the positions served to some rank and done by none, in plan order; with the same epoch and
// num_samples. `ranks` has one entry per rank of `shard` (world_size entries). Takes time and
// memory linear in plan.size() (two bits per position while it runs).
Plan RemainingPlan(const Plan& plan, const ShardSpec& shard, absl::Span<const RankDone> ranks);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_EPOCH_DEAL_H_
