// Job: one training run's sampler state and its state machine over epochs.
//
//   created ──(uniform base)──> epoch 0 planned ──> serving e ──(every rank EndEpoch(e))──>
//   planning e+1 in the background (weights recomputed from the losses, then the plan) ──>
//   serving e+1 ...
// Jobs with STATIC or CLASS_BALANCED base weights wait for their upload before epoch 0's plan.
//
// Thread-safety: all public methods are safe to call concurrently. The mutex is never held while
// a plan or weights are computed or while a client is streamed to: readers take a reference to
// the immutable EpochView (plan + weights of the epoch) and release the lock.
//
// Lock order: planner_mu_, then mu_, then lookahead_mu_ (each may be taken alone). The planner
// thread takes mu_ and lookahead_mu_ but never planner_mu_, so joining it under planner_mu_ is
// safe.
//
// Rules (see proto/samplerd.proto for the client-visible contract):
//   - Losses for the current epoch are applied once its plan is ready; older epochs are counted
//     as stale; later epochs are FAILED_PRECONDITION.
//   - A batch (epoch, rank, seq) already applied is a duplicate. One loss per (epoch, index): a
//     second report of it (a tensor-parallel peer of the same rank, or an index drawn twice with
//     replacement) counts as a duplicate (LossTable).
//   - Every request is validated whole before anything changes.
//
// Persistence (when the job has a JobJournal): every state change is appended to the journal
// under mu_ before it is applied, so the log's order is the order of application; a snapshot is
// written when an epoch opens, before it is published. Callers acknowledge a change to a client
// only after Sync() (EndEpoch and uploads sync themselves). Restore rebuilds a job from its
// journal by replaying the log through the same methods.
#ifndef SAMPLERD_SERVER_JOB_H_
#define SAMPLERD_SERVER_JOB_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/compute_backend.h"
#include "proto/samplerd.pb.h"
#include "server/job_config.h"
#include "server/loss_table.h"
#include "server/persistence/job_journal.h"

namespace samplerd {

// The immutable state of one epoch that readers stream from.
struct EpochView {
  std::shared_ptr<const Plan> plan;
  // W_e, mean 1; empty for uniform weights.
  std::shared_ptr<const std::vector<float>> weights;
  // Whether importance-sampling weights are all 1 (uniform weights, or M == N without
  // replacement where the weights have no effect).
  bool unit_is_weights = true;
};

// What a StreamShard caller needs: the epoch's view and the geometry of its shard.
struct ShardLease {
  EpochView view;
  ShardSpec shard;
  uint64_t shard_length = 0;
};

// A loss batch as the core sees it (the service unpacks the proto into spans).
struct LossBatchView {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint64_t seq = 0;
  absl::Span<const uint64_t> indices;
  absl::Span<const float> losses;
};

class Job {
 public:
  // Creates the job; for a uniform base the plan of epoch 0 is computed before returning.
  // `backend` must outlive the job. With a `journal` (a new, empty one) the job is persisted:
  // its first snapshot is durable when Create returns; on error the journal is removed.
  static absl::StatusOr<std::unique_ptr<Job>> Create(std::string name, JobConfig config,
                                                     ComputeBackend* backend,
                                                     std::unique_ptr<JobJournal> journal = nullptr);

  // Rebuilds a persisted job: its newest snapshot, then its log replayed. `config` must be the
  // one made from the snapshot's spec. DATA_LOSS if the log does not fit the snapshot.
  static absl::StatusOr<std::unique_ptr<Job>> Restore(std::string name, JobConfig config,
                                                      ComputeBackend* backend,
                                                      JobJournal::Recovered recovered);
  ~Job();

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& name() const { return name_; }
  const JobConfig& config() const { return config_; }

  // Current epoch and readiness, as the proto Job.
  v1::Job Describe() const ABSL_LOCKS_EXCLUDED(mu_);

  // Static weights / class labels (N values). FAILED_PRECONDITION if the base policy differs or
  // the job already started (a shard position was streamed, a loss accepted or a rank ended an
  // epoch);
  // INVALID_ARGUMENT for bad values. On success the plan of epoch 0 is computed before returning. A
  // re-upload withdraws epoch 0's plan while the new one is computed (shards wait, losses and
  // EndEpoch are FAILED_PRECONDITION); if it fails, the previous plan stays.
  absl::Status UploadWeights(std::vector<float> weights) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UploadLabels(const std::vector<uint32_t>& labels) ABSL_LOCKS_EXCLUDED(mu_);

  // The shard of (epoch, rank) for a caller with `world_size`. Waits until `deadline` for an
  // epoch still being planned (the current one, or the next one while ranks finish the current
  // one). While waiting, `cancelled` (if set) is polled every 100 ms so that a caller that went
  // away does not hold its thread until the barrier. Errors: FAILED_PRECONDITION (world size
  // mismatch, epoch closed or too far ahead), INVALID_ARGUMENT (rank), DEADLINE_EXCEEDED,
  // CANCELLED, UNAVAILABLE (shutting down), NOT_FOUND (deleted).
  absl::StatusOr<ShardLease> AcquireShard(uint64_t epoch, uint32_t rank, uint32_t world_size,
                                          absl::Time deadline,
                                          const std::function<bool()>& cancelled = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records that `rank` has been sent shard positions up to `position` in `epoch` (the highest
  // position counts). Returns the reason the job was closed (NOT_FOUND: deleted; UNAVAILABLE:
  // shutting down), OK while it is open, so that a streamer learns it without another lock.
  absl::Status RecordStreamed(uint64_t epoch, uint32_t rank, uint64_t position)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Validates the batch whole, then applies it; adds to `summary` (accepted, stale, duplicates;
  // stale_epochs kept ascending without repeats).
  absl::Status ReportLosses(const LossBatchView& batch, v1::LossReportSummary* summary)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Rank `rank` finished `epoch`. Idempotent. The last rank starts planning epoch + 1.
  absl::StatusOr<v1::EndEpochResponse> EndEpoch(uint64_t epoch, uint32_t rank)
      ABSL_LOCKS_EXCLUDED(mu_);

  v1::JobStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every change applied so far durable (no-op without a journal). A ReportLosses caller
  // acknowledges its batches only after this returned OK.
  absl::Status Sync();

  // Deletes the persisted state (after Close; the job was deleted). No-op without a journal.
  absl::Status RemovePersistedState();

  // Wakes every waiter with `reason` (UNAVAILABLE for shutdown, NOT_FOUND for deletion) and
  // refuses further calls; waits for a background plan to finish.
  void Close(absl::Status reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Job(std::string name, JobConfig config, ComputeBackend* backend,
      std::unique_ptr<JobJournal> journal);

  // Per-epoch bookkeeping, reset when an epoch opens.
  struct RankState {
    uint64_t streamed = 0;
    uint64_t accepted = 0;
    bool ended = false;
    absl::flat_hash_set<uint64_t> seqs;  // Loss batches applied.
  };

  // Computes W_{e+1} and plan(e+1) off the lock, then publishes them. Runs on planner_.
  void PlanNextEpoch(uint64_t closed_epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Plans `epoch` with `weights` (no lock; or takes the plan computed ahead) and publishes it as
  // the current epoch in one critical section that also installs `new_base` (if non-null) and
  // clears planning_; then, if plans do not depend on the weights, starts planning the next.
  // On error nothing is published and planning_ is left to the caller.
  // With a journal, the snapshot of `epoch` is staged first (unless `write_snapshot` is false:
  // Restore publishes the epoch of the snapshot it read), the epoch's log opened, and after the
  // publication the snapshot is committed (fsync; then the older files go). A commit error is
  // returned with `*published` (if given) true: the epoch stays published, and recovery starts
  // from the older files.
  absl::Status PlanAndPublish(uint64_t epoch, std::shared_ptr<const std::vector<float>> weights,
                              double recompute_ms,
                              std::shared_ptr<const std::vector<float>> new_base,
                              bool write_snapshot = true, bool* published = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_, lookahead_mu_);
  // Stages the snapshot opening `epoch` (W_epoch = `weights`; base: `new_base` or base_).
  // Requires that losses_ is not being written (planning_ set, or no plan published yet).
  absl::Status StageEpochStart(uint64_t epoch, bool planned, const std::vector<float>* weights,
                               std::shared_ptr<const std::vector<float>> new_base)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Appends `record` to the journal unless replaying (then the record is the journal's own).
  absl::Status Log(const state::WalRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replays a restored log, record by record (the caller set replaying_).
  absl::Status Replay(const std::vector<state::WalRecord>& records) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a plan depends only on (seed, epoch): sequential order, every sample once (M == N
  // without replacement), or fixed uniform weights. Such plans are computed one epoch ahead.
  bool PlanIgnoresWeights() const;
  // Installs base weights (after validation) and plans epoch 0.
  absl::Status InstallBaseAndPlan(std::vector<float> base) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckOpen() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRank(uint32_t rank) const;
  void ResetEpochState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const JobConfig config_;
  ComputeBackend* const backend_;
  // Null for a job kept in memory only.
  const std::unique_ptr<JobJournal> journal_;

  mutable absl::Mutex mu_;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // Non-OK once closed.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool plan_ready_ ABSL_GUARDED_BY(mu_) = false;
  // A shard position streamed, a loss accepted or a rank ended an epoch: the plan of the epoch
  // was used, so an upload can no longer replace it.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Restore is replaying the journal: changes are not logged again.
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;
  EpochView current_ ABSL_GUARDED_BY(mu_);
  // Base weights (mean 1) for STATIC / CLASS_BALANCED; empty for UNIFORM. Replaced only before
  // the job starts.
  std::shared_ptr<const std::vector<float>> base_ ABSL_GUARDED_BY(mu_);
  // Read by the planner thread without mu_ before it publishes the plan (plan_ready_ false);
  // ReportLosses writes it only under mu_ with plan_ready_ true, so the two never overlap.
  LossTable losses_;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  uint32_t ranks_ended_ ABSL_GUARDED_BY(mu_) = 0;
  // Epoch 0 being planned after an upload, or a closed epoch's successor being planned; cleared
  // in the same critical section that publishes the plan.
  bool planning_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status planning_error_ ABSL_GUARDED_BY(mu_);
  WeightSummary weight_summary_ ABSL_GUARDED_BY(mu_);
  double last_recompute_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double last_plan_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t samples_seen_ ABSL_GUARDED_BY(mu_) = 0;

  // The background planning of the next epoch; joined before reuse and on Close. A new planner
  // is started only under planner_mu_ after checking closed_, so Close (which sets closed_, then
  // joins under planner_mu_) never leaves one running. Lock order: planner_mu_, then mu_.
  absl::Mutex planner_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread planner_ ABSL_GUARDED_BY(planner_mu_);
  // The plan of epoch lookahead_epoch_, computed ahead (see PlanIgnoresWeights); costs one more
  // plan in memory. Lock order: mu_, then lookahead_mu_.
  absl::Mutex lookahead_mu_ ABSL_ACQUIRED_AFTER(mu_);
  uint64_t lookahead_epoch_ ABSL_GUARDED_BY(lookahead_mu_) = 0;
  std::future<absl::StatusOr<Plan>> lookahead_ ABSL_GUARDED_BY(lookahead_mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_H_
