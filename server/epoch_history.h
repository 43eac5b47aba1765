// EpochHistory: what a Job remembers of its past, one interface whatever keeps it. The job calls
// it unconditionally at each of its events; two implementations:
//
//   - in memory (MakeInMemoryHistory): the newest `rewind_epochs` epoch starts copied to the
//     host as each epoch opens (weights, base and loss statistics: 12 bytes per sample each);
//     the logging and syncing calls do nothing.
//   - journal-backed (MakeJournalHistory): the job's JobJournal (persistence/job_journal.h),
//     whose snapshots are the epoch starts kept and whose write-ahead log records every state
//     change before it is applied. The journal owns the order of snapshots and logs.
//
// Events, in the order the job makes them:
//   AwaitUpload                       a STATIC / CLASS_BALANCED job created (epoch 0, no plan)
//   BeforePublishing, AfterPublishing an epoch opened by an upload (or a UNIFORM creation) or
//                                     by the EndEpoch that closed the previous epoch
//   Log*                              a change about to be applied (under the job's lock)
//   Rewind                            the job goes back to a kept start
//   Sync                              before a change is acknowledged to a client
//   Remove                            the job was deleted
//
// Thread-safety: all methods may be called concurrently. Lock order: the Job's mutex, then the
// history's (the Log* calls are made under the job's lock).
#ifndef SAMPLERD_SERVER_EPOCH_HISTORY_H_
#define SAMPLERD_SERVER_EPOCH_HISTORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/compute_backend.h"
#include "server/epoch_planner.h"
#include "server/job_config.h"
#include "server/loss_batch.h"
#include "server/persistence/job_journal.h"

namespace samplerd {

class EpochHistory {
 public:
  using EpochStart = JobJournal::EpochStart;

  virtual ~EpochHistory() = default;

  // ---- Epochs opening.

  // A job created awaiting its upload: epoch 0, nothing planned. Durable when it returns.
  virtual absl::Status AwaitUpload() = 0;

  // An epoch whose plan is about to be published.
  struct Opening {
    enum class By {
      kUpload,    // Epoch 0 planned by an upload (or the creation of a UNIFORM job).
      kEndEpoch,  // The epoch after the one every rank ended.
    };
    By by = By::kUpload;
    const PlannedEpoch* planned = nullptr;       // The epoch and its weights.
    std::shared_ptr<const BackendWeights> base;  // The job's base weights then (null: uniform).
    // REDUCIBLE_LOSS: the job's irreducible losses (null for another policy), kept with the
    // snapshots as the base weights are.
    std::shared_ptr<const std::vector<float>> irreducible;
    uint32_t world_size = 0;                     // The ranks its deal 0 is dealt to.
    // The job's loss statistics (null without a loss policy), readable during BeforePublishing
    // only: the job is Planning, so nothing writes them.
    const BackendLossStats* losses = nullptr;
  };
  // Before `opening` is published: what must be kept or durable before ranks are served (an
  // upload's snapshot is, since no log holds an upload; an EndEpoch's opens the epoch's log).
  // An error: nothing is published, the planning failed.
  virtual absl::Status BeforePublishing(const Opening& opening) = 0;
  // After it is published, off the boundary's path (a journal schedules the epoch's snapshot).
  // An error fails the job ("snapshotting").
  virtual absl::Status AfterPublishing(const Opening& opening) = 0;

  // ---- Changes within an epoch, recorded before they are applied (in the order applied).

  // A loss batch prepared for LogLosses before the job takes its lock (encoding it costs time
  // linear in its size); empty when nothing is recorded.
  using LossRecord = std::optional<JobJournal::EncodedLosses>;
  virtual LossRecord PrepareLosses(const LossBatchView& batch) const = 0;
  virtual absl::Status LogLosses(const LossRecord& record) = 0;
  virtual absl::Status LogRankEnded(uint64_t epoch, uint32_t deal, uint32_t rank) = 0;
  // Progress only: never synced on its own.
  virtual absl::Status LogStreamed(uint64_t epoch, uint32_t deal, uint32_t rank,
                                   uint64_t position) = 0;
  virtual absl::Status LogResized(uint64_t epoch, uint32_t world_size) = 0;
  // A mixture job's SetGroupWeights during `epoch` (in force from epoch + 1).
  virtual absl::Status LogGroupWeightsSet(uint64_t epoch, absl::Span<const double> weights) = 0;
  // Makes every change recorded so far durable (a no-op in memory).
  virtual absl::Status Sync() = 0;
  // Deletes what is persisted (the job was deleted). Waits for an epoch's opening, a rewind or a
  // read in progress; afterwards those calls touch nothing and return NOT_FOUND (a deleted
  // job's files are never written again, whichever call races the deletion).
  virtual absl::Status Remove() = 0;

  // ---- Rewinds.

  // The epochs whose start is kept, ascending (none with rewind_epochs = 0).
  virtual std::vector<uint64_t> KeptEpochs() const = 0;
  // The kept start of `epoch` (a copy). FAILED_PRECONDITION if it is no longer kept or was
  // never planned; DATA_LOSS if its snapshot is damaged.
  virtual absl::StatusOr<EpochStart> Read(uint64_t epoch) const = 0;
  // Forgets everything after the start of `epoch` (which Read returned): durable when it
  // returns. FAILED_PRECONDITION, with nothing changed, if the start is no longer kept; any
  // other error may leave the rewind half done (a journal then refuses further writes, and the
  // next start finishes it).
  virtual absl::Status Rewind(uint64_t epoch) = 0;
};

// An epoch start as a snapshot holds it, for `name`'s job with `config` (its spec serialised).
JobJournal::EpochStart MakeEpochStart(const std::string& name, const JobConfig& config,
                                      uint64_t epoch, bool planned, uint32_t world_size,
                                      std::shared_ptr<const std::vector<float>> base,
                                      std::shared_ptr<const std::vector<float>> weights);

// The host values of backend weights, for a snapshot or a kept epoch start: null for uniform
// (null). The CPU backend's own vector (no copy); a copy from the device for CUDA.
absl::StatusOr<std::shared_ptr<const std::vector<float>>> HostWeights(
    const std::shared_ptr<const BackendWeights>& weights);

// A job kept in memory only: keeps config.rewind_epochs epoch starts.
std::unique_ptr<EpochHistory> MakeInMemoryHistory(std::string name, const JobConfig& config);
// A persisted job: `journal` (a new one, or a recovered one after its replay) keeps
// config.rewind_epochs snapshots (at least one).
std::unique_ptr<EpochHistory> MakeJournalHistory(std::string name, const JobConfig& config,
                                                 std::unique_ptr<JobJournal> journal);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_EPOCH_HISTORY_H_
