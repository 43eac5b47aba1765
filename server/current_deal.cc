// CurrentDeal: the current deal's numbers, its ranks' progress and the checks against them.
#include "server/current_deal.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/epoch_deal.h"

namespace samplerd {
namespace {

// Ranks named in a message about the ranks that have not ended an epoch.
constexpr size_t kRanksNamed = 16;

}  // namespace

CurrentDeal::CurrentDeal(std::string job, ShardSpec shard, uint64_t length)
    : job_(std::move(job)),
      shard_(shard),
      start_world_size_(shard.world_size),
      length_(length),
      ranks_(shard.world_size) {}

void CurrentDeal::DealNextEpoch(uint64_t plan_length) {
  number_ = 0;
  length_ = plan_length;
}

void CurrentDeal::DealAgain(uint32_t world_size) {
  number_ = 0;
  if (world_size != 0) shard_.world_size = world_size;
  start_world_size_ = shard_.world_size;
}

void CurrentDeal::ServeEpoch(uint64_t plan_length) {
  length_ = plan_length;
  if (number_ == 0) start_world_size_ = shard_.world_size;  // Not a re-upload after a resize.
  ranks_.assign(shard_.world_size, RankState());
  ranks_ended_ = 0;
  replaced_started_ = false;
}

void CurrentDeal::Redeal(uint32_t world_size, uint64_t plan_length, bool replaced_started) {
  // The replaced deal's progress is cleared below; that the epoch had started is not.
  if (replaced_started) replaced_started_ = true;
  ++number_;
  shard_.world_size = world_size;
  length_ = plan_length;
  ranks_.assign(world_size, RankState());
  ranks_ended_ = 0;
}

Plan CurrentDeal::Progress::Remaining(const Plan& plan) const {
  std::vector<RankDone> done;
  done.reserve(ranks.size());
  for (const RankState& r : ranks) done.push_back(RankDone{&r.reported, r.ended});
  return RemainingPlan(plan, shard, absl::MakeSpan(done));
}

CurrentDeal::Progress CurrentDeal::TakeProgress() {
  Progress progress{shard_, std::move(ranks_)};
  ranks_.assign(shard_.world_size, RankState());
  return progress;
}

void CurrentDeal::PutBack(Progress progress) { ranks_ = std::move(progress.ranks); }

bool CurrentDeal::Started() const {
  return replaced_started_ ||
         std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.Started(); });
}

bool CurrentDeal::AnyDone() const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const RankState& r) { return r.ended || r.reported.count() > 0; });
}

bool CurrentDeal::MarkEnded(uint32_t rank) {
  RankState& state = ranks_[rank];
  if (state.ended) return false;
  state.ended = true;
  ++ranks_ended_;
  return true;
}

std::string CurrentDeal::RanksNotEnded() const {
  // Stops at the named ranks: a StreamShard that finds its epoch not settled yet builds this
  // message (Job::AcquireShard) while holding the job's lock, once per waiting rank, so a scan
  // of every rank made the ranks' arrival at a boundary O(world_size^2) (issue 22).
  std::vector<uint32_t> named;
  for (uint32_t r = 0; r < ranks_.size() && named.size() < kRanksNamed; ++r) {
    if (!ranks_[r].ended) named.push_back(r);
  }
  const size_t ended = std::min<size_t>(ranks_ended_, ranks_.size());
  const size_t waiting = std::max(ranks_.size() - ended, named.size());
  return absl::StrCat(
      "ranks ", absl::StrJoin(named, ", "),
      waiting > named.size() ? absl::StrCat(" and ", waiting - named.size(), " more") : "",
      " of world_size ", shard_.world_size, " have not ended it (EndEpoch)");
}

absl::Status CurrentDeal::CheckDeal(uint64_t epoch, uint32_t deal) const {
  if (deal == number_) return absl::OkStatus();
  if (deal < number_) {
    return absl::FailedPreconditionError(
        absl::StrCat("deal = ", deal, " of epoch ", epoch, " of job '", job_,
                     "' was replaced by deal ", number_, " (", shard_.world_size,
                     " ranks) when the group was resized; what it had not done was "
                     "dealt again: re-read the job (GetJob) and use deal ",
                     number_));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("deal = ", deal, " of epoch ", epoch, " of job '", job_,
                   "' does not exist; the current deal is ", number_));
}

absl::Status CurrentDeal::CheckWorldSize(uint64_t epoch, uint32_t world_size) const {
  if (world_size == shard_.world_size) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "world_size = ", world_size, " does not match the ", shard_.world_size, " ranks that epoch ",
      epoch, " of job '", job_, "' is dealt to (deal ", number_,
      "); if the group's size changed, its first rank resizes the job (ResizeJob; Python: "
      "DistributedWeightedSampler(..., elastic=True))"));
}

absl::StatusOr<uint64_t> CurrentDeal::ShardLength(uint32_t rank) const {
  return ::samplerd::ShardLength(length_, shard_, rank);
}

absl::StatusOr<size_t> CurrentDeal::CheckLosses(const LossBatchView& batch,
                                                const Plan& plan) const {
  absl::StatusOr<uint64_t> shard_length = ShardLength(batch.rank);
  if (!shard_length.ok()) return shard_length.status();  // The rank.
  if (absl::Status s = ValidateLossPositions(batch, *shard_length); !s.ok()) return s;
  // Each index must be the one this rank was served at its position: a loss for another rank's
  // sample would otherwise take that sample's one loss of the epoch.
  const RankState& rank = ranks_[batch.rank];
  size_t fresh = 0;
  for (size_t k = 0; k < batch.indices.size(); ++k) {
    const uint64_t position = batch.position(k);
    const uint64_t served = plan[ShardToPlanPosition(length_, shard_, batch.rank, position)];
    if (served != batch.indices[k]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", k, "] = ", batch.indices[k], " was not served to rank ", batch.rank, " at ",
          batch.consecutive ? absl::StrCat("position ", position, " (first_position + ", k, ")")
                            : absl::StrCat("positions[", k, "] = ", position),
          " of epoch ", batch.epoch, batch.deal > 0 ? absl::StrCat(" (deal ", batch.deal, ")") : "",
          " (that position holds index ", served,
          "): report each loss under the index and the shard position the rank was served"));
    }
    fresh += !rank.reported.Contains(position);
  }
  return fresh;
}

CurrentDeal::NewLosses CurrentDeal::MarkReported(const LossBatchView& batch) {
  const uint64_t shard_length = *ShardLength(batch.rank);  // CheckLosses checked the rank.
  RankState& rank = ranks_[batch.rank];
  // The pairs at positions new to the rank, in arrival order: the whole batch unless some
  // position was reported before (or twice in it); then copied from the first one that was.
  NewLosses fresh;
  fresh.all_indices_ = batch.indices;
  fresh.all_losses_ = batch.losses;
  for (size_t k = 0; k < batch.indices.size(); ++k) {
    // A position reported was streamed: the record holds it even if the server stopped between
    // a stream's Write and its RecordStreamed (a client checks a loaded state against it).
    rank.streamed = std::max(rank.streamed, batch.position(k) + 1);
    const bool inserted = rank.reported.Insert(batch.position(k), shard_length);
    if (!inserted && fresh.all_) {
      fresh.all_ = false;
      fresh.indices_.assign(batch.indices.begin(), batch.indices.begin() + k);
      fresh.losses_.assign(batch.losses.begin(), batch.losses.begin() + k);
    } else if (inserted && !fresh.all_) {
      fresh.indices_.push_back(batch.indices[k]);
      fresh.losses_.push_back(batch.losses[k]);
    }
  }
  return fresh;
}

}  // namespace samplerd
