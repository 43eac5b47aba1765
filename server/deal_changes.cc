#include "server/deal_changes.h"

namespace samplerd {

absl::Status DealChanges::Streamed(uint64_t epoch, uint32_t rank, uint64_t position) {
  absl::Status logged = history_->LogStreamed(epoch, deal_->number(), rank, position);
  deal_->MarkStreamed(rank, position);
  return logged;
}

absl::StatusOr<CurrentDeal::NewLosses> DealChanges::Reported(
    const LossBatchView& batch, const EpochHistory::LossRecord& record) {
  if (absl::Status s = history_->LogLosses(record); !s.ok()) return s;
  return deal_->MarkReported(batch);
}

absl::Status DealChanges::Ended(uint64_t epoch, uint32_t rank) {
  if (deal_->ranks()[rank].ended) return absl::OkStatus();
  if (absl::Status s = history_->LogRankEnded(epoch, deal_->number(), rank); !s.ok()) return s;
  deal_->MarkEnded(rank);
  return absl::OkStatus();
}

absl::Status DealChanges::Redealt(uint64_t epoch, uint32_t world_size, uint64_t plan_length,
                                  bool replaced_started) {
  if (absl::Status s = history_->LogResized(epoch, world_size); !s.ok()) return s;
  deal_->Redeal(world_size, plan_length, replaced_started);
  return absl::OkStatus();
}

}  // namespace samplerd
