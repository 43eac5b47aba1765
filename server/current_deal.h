// CurrentDeal: the deal of a job's current epoch that its ranks are served from (epoch_deal.h):
// its number, its ranks (the world size), the plan positions it deals, and each rank's progress
// (positions streamed, shard positions whose loss was reported, whether it ended the epoch).
// It holds the checks a request makes against the deal (deal number, world size, rank, that
// each reported index was served at its position) and the duplicate detection of loss reports.
//
// Plain data: no phase, no lock, no persistence. The Job holds it under its mutex and decides
// when a deal starts (EndEpoch, Resize, Rewind); the changes the job's history records (a
// rank's progress, its losses, its end of the epoch, a resize's deal) are made only through
// DealChanges (deal_changes.h), which logs each before it applies it here.
// Messages name the job (given at construction) as the Job's own do.
//
// Not thread-safe.
#ifndef SAMPLERD_SERVER_CURRENT_DEAL_H_
#define SAMPLERD_SERVER_CURRENT_DEAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/plan.h"
#include "kernels/shard.h"
#include "server/loss_batch.h"
#include "server/position_set.h"

namespace samplerd {

class CurrentDeal {
 public:
  // Per-epoch progress of one rank of the deal.
  struct RankState {
    uint64_t streamed = 0;  // Shard positions sent (the highest; past every one reported).
    uint64_t accepted = 0;  // Losses accepted.
    bool ended = false;
    PositionSet reported;  // Shard positions whose loss was reported (and logged).
    bool Started() const { return streamed > 0 || ended || reported.count() > 0; }
  };

  // Deal 0 of epoch 0 of `job`: `length` plan positions to `shard`'s ranks, none started.
  CurrentDeal(std::string job, ShardSpec shard, uint64_t length);

  uint32_t number() const { return number_; }
  const ShardSpec& shard() const { return shard_; }
  uint32_t world_size() const { return shard_.world_size; }
  // The plan positions the deal deals (M in deal 0; what a resize left in a later one).
  uint64_t length() const { return length_; }
  // The world size of the epoch's deal 0 (the ranks it started with), which its snapshot and
  // kept start record: a restart replays the epoch's resizes on top of it, a rewind deals it
  // again. A re-upload of epoch 0's weights after a resize keeps it.
  uint32_t start_world_size() const { return start_world_size_; }
  const std::vector<RankState>& ranks() const { return ranks_; }
  uint32_t ranks_ended() const { return ranks_ended_; }
  bool AllEnded() const { return ranks_ended_ >= shard_.world_size; }

  // ---- Deals starting.

  // The epoch closed: the next one is dealt whole (`plan_length` positions) in its deal 0 to
  // the ranks that ended this one. The progress stays visible until ServeEpoch.
  void DealNextEpoch(uint64_t plan_length);
  // Deal 0 of an epoch started again (a rewind, a restored snapshot) to `world_size` ranks
  // (0: the current world size).
  void DealAgain(uint32_t world_size);
  // The epoch's plan (`plan_length` positions) is published: every rank's progress cleared.
  // In deal 0, its world size becomes the epoch's start world size.
  void ServeEpoch(uint64_t plan_length);

  // The deal's progress, taken out for a re-deal computed off the lock (the deal's ranks start
  // over meanwhile); PutBack restores it if the re-deal is abandoned.
  struct Progress {
    ShardSpec shard;
    std::vector<RankState> ranks;
    // The plan of the next deal: `plan`'s positions served and done by no rank (RemainingPlan).
    Plan Remaining(const Plan& plan) const;
  };
  Progress TakeProgress();
  void PutBack(Progress progress);

  // ---- What the ranks did.

  // Whether the epoch started in this deal or a replaced one (a rank streamed, reported or
  // ended), so that an upload can no longer replace the plan those ranks were served.
  bool Started() const;
  // Whether a rank reported a loss or ended the epoch (then a resize deals what is left).
  bool AnyDone() const;
  // Whether `position` is further than `rank` of deal `deal` was streamed.
  bool Advances(uint32_t deal, uint32_t rank, uint64_t position) const {
    return deal == number_ && rank < ranks_.size() && position > ranks_[rank].streamed;
  }
  // "ranks 0, 2 of world_size 4 have not ended it (EndEpoch)", at most 16 ranks named.
  std::string RanksNotEnded() const;

  // ---- Checks (FAILED_PRECONDITION / INVALID_ARGUMENT naming the job, the epoch and the deal).

  // OK if `deal` is this deal (a straggler of a group that was resized names a replaced one).
  absl::Status CheckDeal(uint64_t epoch, uint32_t deal) const;
  // OK if `world_size` is this deal's (StreamShard's world_size).
  absl::Status CheckWorldSize(uint64_t epoch, uint32_t world_size) const;
  // The length of `rank`'s shard in this deal; INVALID_ARGUMENT for a rank outside it
  // (undecorated: the caller names the job).
  absl::StatusOr<uint64_t> ShardLength(uint32_t rank) const;

  // The positions of a loss batch (validated whole: rank, positions, each index the one `plan`,
  // the deal's plan, serves at its position) that `batch.rank` has not reported before.
  class NewLosses {
   public:
    absl::Span<const uint64_t> indices() const { return all_ ? all_indices_ : indices_; }
    absl::Span<const float> losses() const { return all_ ? all_losses_ : losses_; }
    size_t size() const { return indices().size(); }

   private:
    friend class CurrentDeal;
    bool all_ = true;
    absl::Span<const uint64_t> all_indices_;
    absl::Span<const float> all_losses_;
    std::vector<uint64_t> indices_;
    std::vector<float> losses_;
  };
  // Validates `batch` against the deal: the rank, its positions within the rank's shard, and
  // that `plan` (the deal's plan) holds each index at its position. Returns the number of
  // positions the rank has not reported before (0: a retry, nothing to apply). Errors are
  // undecorated but for the served-index one, which names the job.
  absl::StatusOr<size_t> CheckLosses(const LossBatchView& batch, const Plan& plan) const;
  void AddAccepted(uint32_t rank, uint64_t accepted) { ranks_[rank].accepted += accepted; }

 private:
  // ---- The recorded changes, made by DealChanges only (logged first).
  friend class DealChanges;
  // Starts the next deal, of `plan_length` positions to `world_size` ranks (a resize).
  // `replaced_started`: a rank of the deal it replaces had started (see Started).
  void Redeal(uint32_t world_size, uint64_t plan_length, bool replaced_started);
  void MarkStreamed(uint32_t rank, uint64_t position) { ranks_[rank].streamed = position; }
  // `rank` (checked) ended the epoch; false if it had already.
  bool MarkEnded(uint32_t rank);
  // After CheckLosses returned a positive count: marks the batch's positions reported (and
  // streamed: the rank's `streamed` is at least one past each) and returns its new pairs, in
  // arrival order (a position twice in the batch counts once).
  NewLosses MarkReported(const LossBatchView& batch);

  std::string job_;
  uint32_t number_ = 0;
  ShardSpec shard_;
  uint32_t start_world_size_ = 0;
  uint64_t length_ = 0;
  std::vector<RankState> ranks_;
  uint32_t ranks_ended_ = 0;
  // A deal of the epoch that a resize replaced had started, so the epoch has, though this deal's
  // ranks have not: an upload must not replace the plan those ranks were served (the losses
  // applied and the records logged against it would stay). Cleared when an epoch is served.
  bool replaced_started_ = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CURRENT_DEAL_H_
