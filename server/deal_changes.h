// DealChanges: the changes of a job's current deal that its history records (CONTRIBUTING 17:
// a change is logged before it is applied), each made by one call that logs it, then applies it
// to the CurrentDeal, so that no caller applies a change without its record, records one change
// and applies another, or applies one whose record failed (cf. LevelDB's
// VersionSet::LogAndApply). The record is made from the same arguments as the change, and the
// deal number in it is the deal's own. CurrentDeal's recording mutators are private to this
// class.
//
// Not thread-safe: the Job calls it under its mutex (the history's locks come after it).
#ifndef SAMPLERD_SERVER_DEAL_CHANGES_H_
#define SAMPLERD_SERVER_DEAL_CHANGES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/current_deal.h"
#include "server/epoch_history.h"
#include "server/loss_batch.h"

namespace samplerd {

class DealChanges {
 public:
  // `history` and `deal` must outlive this object.
  DealChanges(EpochHistory* history, CurrentDeal* deal) : history_(history), deal_(deal) {}

  // `rank` was sent the positions before `position` of `epoch` (CurrentDeal::Advances checked).
  // Progress only: applied even if its record failed (the positions were handed out, so a
  // re-upload must no longer replace their plan); the failed write is returned for the caller
  // to report, and the journal, which keeps the error, acknowledges nothing further.
  absl::Status Streamed(uint64_t epoch, uint32_t rank, uint64_t position);

  // After CurrentDeal::CheckLosses returned a positive count for `batch`: `record` (the
  // history's PrepareLosses of `batch`) logged, then the batch's positions marked reported
  // (CurrentDeal::MarkReported, whose new pairs are returned). The log's error, with nothing
  // applied, if the record failed.
  absl::StatusOr<CurrentDeal::NewLosses> Reported(const LossBatchView& batch,
                                                  const EpochHistory::LossRecord& record);

  // `rank` (checked) of the deal ended `epoch`: logged, then marked; nothing recorded if it had
  // ended already. The log's error, with nothing applied, if the record failed.
  absl::Status Ended(uint64_t epoch, uint32_t rank);

  // The next deal of `epoch`, of `plan_length` positions to `world_size` ranks (a resize;
  // CurrentDeal::Redeal): logged, then started. The log's error, with nothing applied, if the
  // record failed.
  absl::Status Redealt(uint64_t epoch, uint32_t world_size, uint64_t plan_length,
                       bool replaced_started);

 private:
  EpochHistory* const history_;
  CurrentDeal* const deal_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_DEAL_CHANGES_H_
