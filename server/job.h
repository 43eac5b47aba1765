// Job: one training run's sampler state, a state machine over epochs made of named parts:
//
//   - its phase (job_phase.h: AwaitingUpload, Planning tagged by its purpose, Serving, Failed,
//     Closed), changed only by Enter, which checks the move against the state diagram;
//   - its current deal (current_deal.h): the ranks, their progress, the checks of a request
//     against the deal and the duplicate detection of loss reports;
//   - its epoch history (epoch_history.h): the epoch starts kept for a rewind and the record of
//     every change, in memory or in a journal, called the same way either way;
//   - its planner (epoch_planner.h), which computes each epoch off the lock; the job publishes it.
//
// Phases (job_phase.h has the rule, MayTransition):
//
//   AwaitingUpload ──upload──> Planning(upload) ──> Serving(0)
//   Serving(e) ──every rank EndEpoch(e)──> Planning(next epoch) ──> Serving(e+1) ...
//   Serving(e) or Failed ──Rewind(e')──> Planning(rewind) ──> Serving(e')
//   Serving(e) ──Resize──> Serving(e), next deal (nothing done yet), or
//              ──Resize──> Planning(re-deal) ──> Serving(e), next deal (what is left)
//   Serving(0), not started ──re-upload──> Planning(upload) ──> Serving(0)
//   Planning(upload, rewind, re-deal) ──failed──> back to the phase it came from (nothing
//       changed: a failed rewind of a Failed job leaves it Failed with its first cause)
//   Planning ──planning, a write or the device failed──> Failed
//   Serving ──applying losses, or copying the weights for a snapshot, failed──> Failed
//   any phase ──Close──> Closed (terminal)
//   Restore: AwaitingUpload ──> Planning(recovery) ──> Serving(e), then the log is replayed.
//
// Jobs with a UNIFORM base plan epoch 0 at creation; STATIC / CLASS_BALANCED jobs wait for their
// upload.
//
// Thread-safety: all public methods are safe to call concurrently. The mutex is never held while
// a plan or weights are computed or while a client is streamed to: readers take a reference to
// the immutable EpochView (plan + weights of the epoch) and release the lock.
//
// Lock order: Job::mu_, then the EpochHistory's locks (the Log* calls are made under mu_). The
// EpochPlanner's locks are never taken with mu_ held; its thread takes mu_ (in the `done`
// callback) but never the planner's own lock, so EpochPlanner::Stop may join it under that lock.
//
// Rules (see proto/samplerd.proto for the client-visible contract):
//   - Losses for the serving epoch are applied; older epochs are counted as stale; later epochs
//     are FAILED_PRECONDITION.
//   - Each epoch is dealt to its ranks in deals (epoch_deal.h): deal 0 deals the plan to the world
//     size the previous epoch ended with; Resize starts the next deal over what the current one
//     has not done. Requests name their deal; one of a replaced deal is FAILED_PRECONDITION.
//   - A loss is identified by (epoch, deal, rank, shard position); the shard must hold its index
//     at that position. A position already reported is a duplicate (PositionSet), whatever process
//     or batch sends it. One loss per (epoch, index): a report from a second position counts as
//     a duplicate too (BackendLossStats::Apply). Without a loss policy the job keeps no
//     per-sample statistics: only positions are deduplicated.
//   - The job's weights and loss statistics are its backend's objects (compute_backend.h: host
//     memory for the CPU, device memory for CUDA); the job holds them by handle and copies them
//     to the host only for a snapshot or a kept epoch start. A failure of the backend while the
//     job runs (a device error applying losses or copying state) fails the job with that error.
//   - Every request is validated whole before anything changes.
//   - Errors name the job: a message that does not already gets " (job '<name>')" (Named).
//
// Persistence (a journal-backed EpochHistory): every state change is recorded under mu_ before
// it is applied (a change of the deal by one call that does both: DealChanges), so the log's
// order is the order of application; the journal owns the order of snapshots and logs around
// an epoch's publication (job_journal.h). Callers acknowledge a change
// to a client only after Sync() (EndEpoch and uploads sync themselves). Restore (job_restore.cc)
// rebuilds a job from its journal by replaying the log through the same methods.
#ifndef SAMPLERD_SERVER_JOB_H_
#define SAMPLERD_SERVER_JOB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/compute_backend.h"
#include "kernels/mixture/group_losses.h"
#include "proto/samplerd.pb.h"
#include "server/current_deal.h"
#include "server/deal_changes.h"
#include "server/epoch_history.h"
#include "server/epoch_planner.h"
#include "server/epoch_waiters.h"
#include "server/job_config.h"
#include "server/job_phase.h"
#include "server/loss_batch.h"
#include "server/persistence/job_journal.h"
#include "server/rank_claims.h"

namespace samplerd {

// Who reads a shard (proto StreamShardRequest): a rank's reader, carrying the incarnation of its
// claim (0: a caller that does not claim; RankClaims::Check has the rule), or an observer, whom
// the rank's claims do not concern.
struct ShardCaller {
  uint64_t incarnation = 0;
  bool observe = false;
};

// What a StreamShard caller needs: the epoch's view and the geometry of its shard.
struct ShardLease {
  EpochView view;  // Its plan is the deal's (the epoch's plan in deal 0).
  ShardSpec shard;
  uint64_t shard_length = 0;
  // The job's irreducible losses (N, as uploaded; REDUCIBLE_LOSS), null for the other policies:
  // what StreamShardRequest.with_irreducible_losses streams beside the indices.
  std::shared_ptr<const std::vector<float>> irreducible;
};

class Job {
 public:
  // Creates the job; for a uniform base the plan of epoch 0 is computed before returning.
  // `backend` must outlive the job. With a `journal` (a new, empty one) the job is persisted:
  // its first snapshot is durable when Create returns; on error the journal is removed.
  static absl::StatusOr<std::unique_ptr<Job>> Create(std::string name, JobConfig config,
                                                     ComputeBackend* backend,
                                                     std::unique_ptr<JobJournal> journal = nullptr);

  // Rebuilds a persisted job (job_restore.cc): its newest snapshot, then its log replayed.
  // `config` must be the one made from the snapshot's spec. DATA_LOSS if the log does not fit
  // the snapshot.
  static absl::StatusOr<std::unique_ptr<Job>> Restore(std::string name, JobConfig config,
                                                      ComputeBackend* backend,
                                                      JobJournal::Recovered recovered);
  ~Job();

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& name() const { return name_; }
  const JobConfig& config() const { return config_; }

  // Current epoch, readiness, world size and deal, as the proto Job.
  v1::Job Describe() const ABSL_LOCKS_EXCLUDED(mu_);
  // Describe, with `rank`'s shard length (proto GetJob with a rank): in the current deal of the
  // current epoch, or in a later `epoch` (the whole plan dealt to the current world size).
  // INVALID_ARGUMENT for a rank outside the world; FAILED_PRECONDITION for a past epoch.
  absl::StatusOr<v1::Job> DescribeForRank(uint32_t rank, std::optional<uint64_t> epoch) const
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t CurrentEpoch() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return epoch_;
  }

  // Static weights / class labels (N values), normalised on the host and handed to the backend
  // (MakeWeights). FAILED_PRECONDITION if the base policy differs or the job already started (a
  // shard position was streamed, a loss accepted or a rank ended an epoch); INVALID_ARGUMENT for
  // bad values. On success the plan of epoch 0 is computed before
  // returning. A re-upload withdraws epoch 0's plan while the new one is computed (shards wait,
  // losses and EndEpoch are FAILED_PRECONDITION); if it fails, the previous plan stays.
  absl::Status UploadWeights(std::vector<float> weights) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UploadLabels(const std::vector<uint32_t>& labels) ABSL_LOCKS_EXCLUDED(mu_);

  // The irreducible losses of REDUCIBLE_LOSS (N values, finite and >= 0: ValidateIrreducibleLosses
  // names the first bad one). FAILED_PRECONDITION if the loss policy is another or the job
  // already started; nothing changes on error. The plan of epoch 0 is computed before returning
  // once the base weights are there too (UNIFORM: at once; STATIC / CLASS_BALANCED: base weights
  // uploaded before wait for these, and these wait for them). A re-upload before the job
  // started replaces them and plans epoch 0 again, as UploadWeights does.
  absl::Status UploadIrreducibleLosses(std::vector<float> losses) ABSL_LOCKS_EXCLUDED(mu_);

  // The shard of (epoch, deal, rank) for `reader`, a caller with `world_size`. Never waits: an
  // epoch still being planned (the current one, or the next one while ranks finish the current
  // one) is DEADLINE_EXCEEDED naming what it waits for (an upload, its planning, or the ranks
  // that have not ended the previous epoch); a caller waits with OnEpochSettled and calls again.
  // The rank's claim is checked first (RankClaims::Check; not for an observer). Errors:
  // ABORTED or FAILED_PRECONDITION (the claim), FAILED_PRECONDITION (world size or deal
  // mismatch, epoch closed or too far ahead), INVALID_ARGUMENT (rank), DEADLINE_EXCEEDED,
  // UNAVAILABLE (shutting down), NOT_FOUND (deleted), INTERNAL (planning failed).
  absl::StatusOr<ShardLease> AcquireShard(uint64_t epoch, uint32_t deal, uint32_t rank,
                                          uint32_t world_size, ShardCaller caller = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // The wait for AcquireShard, without a thread: runs `ready` once, without the job's lock, when
  // AcquireShard(epoch, ...) would no longer answer DEADLINE_EXCEEDED for the epoch (it is
  // served, or can no longer be: closed, failed, passed or too far ahead) or `deadline` has
  // passed; the caller then calls AcquireShard (if the state moved on meanwhile, e.g. a rewind
  // withdrew the plan, it answers DEADLINE_EXCEEDED again: wait again before `deadline`). `ready`
  // runs on the caller's thread when the epoch is settled already (then the result is 0), else on
  // the job's watcher thread (the result is an id for CancelWait); it must not block, nor drop the
  // last reference to the job (EpochWaiters::Add). Waiters cost memory only: one watcher thread per
  // job serves them all.
  uint64_t OnEpochSettled(uint64_t epoch, absl::Time deadline, std::function<void()> ready)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return waiters_.Add(epoch, deadline, std::move(ready));
  }
  // Withdraws a waiter of OnEpochSettled (a caller that went away). True if `ready` will not
  // run; false if it has run or is running (or `id` is 0).
  bool CancelWait(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) { return waiters_.Cancel(id); }

  // Records that `rank` of `deal` has been sent shard positions up to `position` in `epoch` (the
  // highest position counts; ignored once the deal was replaced). Returns the reason the job
  // was closed (NOT_FOUND: deleted; UNAVAILABLE: shutting down), OK while it is open, so that a
  // streamer learns it without another lock.
  absl::Status RecordStreamed(uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Checks the rank's claim (batch.incarnation, RankClaims::Check), validates the batch whole
  // (also that the rank's shard holds each index at its position),
  // then applies its new positions (their losses in one BackendLossStats::Apply, in arrival
  // order); adds to `summary` (accepted, stale, duplicates; stale_epochs kept ascending without
  // repeats). A batch with no new position is not logged. If the backend fails to apply them (a
  // device error), the job is Failed with that error, which is returned (nothing acknowledged).
  absl::Status ReportLosses(const LossBatchView& batch, v1::LossReportSummary* summary)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Rank `rank` of `deal` finished `epoch`, for a caller carrying `incarnation` (its claim's,
  // checked first: RankClaims::Check). Idempotent. The last rank starts planning epoch + 1.
  absl::StatusOr<v1::EndEpochResponse> EndEpoch(uint64_t epoch, uint32_t deal, uint32_t rank,
                                                uint64_t incarnation = 0) ABSL_LOCKS_EXCLUDED(mu_);

  // The group now has `world_size` ranks (proto ResizeJob): starts the next deal of `epoch`
  // (which must be current) over the positions the current deal has not done
  // (RemainingPlan, computed off the lock while the job waits as Planning), every rank's
  // progress cleared. A no-op when the epoch's world size is `world_size` already. Waits for a
  // planning in progress. Errors: INVALID_ARGUMENT (world_size), FAILED_PRECONDITION (not the
  // current epoch, or no plan yet: awaiting the upload), the close reason, INTERNAL (planning
  // failed, or the journal's write: then nothing changed). With a journal the resize is durable
  // when it returns.
  absl::StatusOr<v1::Job> Resize(uint64_t epoch, uint32_t world_size) ABSL_LOCKS_EXCLUDED(mu_);

  // A mixture job with static group weights (proto SetGroupWeights): `weights` in force from
  // the first epoch not yet planned, which is the returned Job's current_epoch + 1 (waits for
  // an epoch being planned). Recorded first (logged), then kept for the next epoch's planning
  // (the last call in an epoch counts); a rewind forgets it. Errors: INVALID_ARGUMENT naming
  // `group_weights[k]` and its value, or their count (nothing changes); FAILED_PRECONDITION for
  // a job that is not a mixture job, or whose weights are online, or whose planning failed; the
  // close reason; INTERNAL (the log's write: then nothing changed).
  absl::StatusOr<v1::Job> SetGroupWeights(std::vector<double> weights) ABSL_LOCKS_EXCLUDED(mu_);

  // Puts the job back to the start of `epoch` (proto RewindJob): its weights, loss statistics
  // and epoch number then, every rank's progress cleared; plans `epoch` again (the same plan as
  // the first time) on the caller's thread and publishes it. Waits for a planning in progress
  // (and for the snapshot of an epoch just opened to be scheduled).
  // FAILED_PRECONDITION if the start of `epoch` is not kept (naming the oldest that is), if it
  // is after the current epoch, or if the job awaits its upload; the close reason if closed.
  // A Failed job can be rewound (that is its way back); a rewind that fails before anything
  // changed leaves the job as it was (a Failed job keeps its first failure's cause).
  // With a journal the rewind is durable when it returns; if writing it fails the job is
  // Failed (INTERNAL) and a restart finishes the rewind.
  absl::Status Rewind(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // The epochs whose start is kept, ascending: the current one's included from the moment it
  // is served (with a journal its snapshot is written in the background; a rewind to it waits
  // for that write, and only if the write fails is the start no longer kept).
  std::vector<uint64_t> RewindableEpochs() const ABSL_LOCKS_EXCLUDED(mu_);

  // One consistent view of the job (taken under one lock acquisition); with `weight_history`, a
  // mixture job's MixtureStatus.history too.
  v1::JobStatus Status(bool weight_history = false) const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every change applied so far durable (no-op without a journal). A ReportLosses caller
  // acknowledges its batches only after this returned OK.
  absl::Status Sync();

  // Deletes the persisted state (after Close; the job was deleted). No-op without a journal.
  absl::Status RemovePersistedState();

  // Wakes every waiter with `reason` (UNAVAILABLE for shutdown, NOT_FOUND for deletion), ends
  // every rank claim with it and refuses further calls; waits for a background plan to finish.
  void Close(absl::Status reason) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Rank claims (proto ClaimRank; the rule is rank_claims.h's; in memory only).

  // Claims `rank` for a caller of a group of `world_size` ranks; returns the incarnation.
  // INVALID_ARGUMENT for a rank outside the world; FAILED_PRECONDITION if `world_size` is not
  // the current deal's, or the rank is held by an incompatible live claimant; the close reason
  // once closed. `ended` runs (once, with the reason) if the job is closed while the claim is
  // held; the caller releases it (claims().Release) when its call ends. `replaces`: see
  // RankClaims::Claim. The requests of the rank carry the incarnation; AcquireShard,
  // ReportLosses and EndEpoch check it.
  absl::StatusOr<uint64_t> ClaimRank(uint32_t rank, uint32_t world_size, bool peer,
                                     RankClaims::Ended ended, uint64_t replaces = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Release and the count of the job's claims. Thread-safe on its own; never takes mu_.
  RankClaims& claims() { return claims_; }

 private:
  Job(std::string name, JobConfig config, ComputeBackend* backend,
      std::unique_ptr<EpochHistory> history);
  // Makes the job's loss statistics with the backend (a loss policy only). Once, by Create and
  // Restore, before the job is used.
  absl::Status MakeLossStats() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- The phase machine.

  // The one way the phase changes: CHECKs that `next` may follow the current phase
  // (MayTransition, the diagram above; a violation is a bug of this class).
  void Enter(JobPhase next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to the phase a failed Planning (upload, rewind, re-deal) came from; `error` fails the
  // job instead if it came from nowhere. A no-op unless Planning (Close left it meanwhile).
  void GoBack(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsPlanning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::holds_alternative<phase::Planning>(phase_);
  }
  // OK while the job is open; the reason it was closed otherwise (NOT_FOUND: deleted;
  // UNAVAILABLE: shutting down).
  absl::Status CloseReason() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a Planning this thread entered was left by another: the close reason, or the failure.
  absl::Status Interrupted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `s` with " (job '<name>')" appended: the one decoration of errors that do not name the job.
  absl::Status Named(const absl::Status& s) const;
  // "it has no plan yet: it waits for UploadWeights" (or UploadLabels).
  std::string NoPlanYet() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The one check that `epoch` is the serving epoch, for ReportLosses, EndEpoch and AcquireShard
  // (each handles an older epoch, stale or a retry, first). OK when serving `epoch`; the close
  // reason when closed; INTERNAL when planning failed; FAILED_PRECONDITION naming the epoch, the
  // current one and the phase otherwise.
  absl::Status CheckEpochOpen(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `epoch` is not served yet, for a DEADLINE_EXCEEDED: the upload, the planning, or the
  // ranks that have not ended the previous epoch.
  std::string WhyNotServing(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the plan of epoch 0 was used (a rank of any of its deals streamed, reported or ended
  // an epoch), so that an upload can no longer replace it.
  bool Started() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_ > 0 || deal_.Started(); }
  // Starts the next deal of the current epoch, serving `view` (the deal's plan) to `world_size`
  // ranks; recorded first: nothing changes if recording fails. `replaced_started`: a rank of the
  // deal it replaces had started.
  absl::Status ApplyResize(EpochView view, uint32_t world_size, bool replaced_started)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // AcquireShard need not wait for `epoch`: served, or never to be (closed, failed, passed, or
  // more than one epoch ahead).
  bool Settled(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Epochs opening.

  // FAILED_PRECONDITION unless uploads are allowed: the job awaits its uploads or serves epoch 0
  // and has not started (the message names the job and its epoch).
  absl::Status CheckUploadAllowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validated base weights (empty: uniform) uploaded: planned by InstallBaseAndPlan, or kept in
  // pending_base_ while REDUCIBLE_LOSS's irreducible losses are missing.
  absl::Status BaseUploaded(std::vector<float> base) ABSL_LOCKS_EXCLUDED(mu_);
  // Installs validated base weights (empty: uniform) as the backend's, and plans epoch 0 (an
  // upload) on the caller's thread.
  absl::Status InstallBaseAndPlan(std::vector<float> base) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `planned` the serving epoch (and `new_base` the base, if set) if the job is still
  // Planning it; returns false (nothing changed) if it was closed or failed meanwhile. With
  // `snapshot_follows`, sets snapshot_unscheduled_ in the same step: the caller then hands the
  // opening to the history (AfterPublishing) and clears it. Then lets the planner compute the
  // next plan ahead.
  bool Publish(const PlannedEpoch& planned, std::shared_ptr<const BackendWeights> new_base,
               bool snapshot_follows = false) ABSL_LOCKS_EXCLUDED(mu_);
  // The planner's `done` after EndEpoch closed `planned`'s predecessor: the history's
  // BeforePublishing, publishes, then its AfterPublishing (off the boundary's path). Runs on the
  // planner thread.
  void FinishPlanningNext(absl::StatusOr<PlannedEpoch> planned) ABSL_LOCKS_EXCLUDED(mu_);
  // A mixture job's `planned` epoch gets the weight history up to it: `before` (the published
  // epochs', or a kept start's) with its own entry (WithEpochWeights). Nothing for other jobs.
  static void AddWeightHistory(PlannedEpoch* planned, const WeightHistory* before);
  // Replays a restored log (job_restore.cc).
  absl::Status Replay(JobJournal& journal, const JobJournal::Recovered& recovered)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the job is not planning; the planning error if it failed.
  absl::Status AwaitNotPlanning() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Rewinds.

  // The kept start of `epoch` (history_->Read). FAILED_PRECONDITION naming the kept epochs if
  // it is not kept.
  absl::StatusOr<JobJournal::EpochStart> FindStart(uint64_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);
  // Backend weights made from a snapshot's or a kept start's host weights (null or empty:
  // uniform, null).
  absl::StatusOr<std::shared_ptr<const BackendWeights>> WeightsFromHost(
      const std::shared_ptr<const std::vector<float>>& host) const;

  // The loss statistics, for the recompute and the history to read without mu_: only while the
  // job is Planning, when no call writes them (ReportLosses needs Serving); a CHECK asserts the
  // phase. Null without a loss policy; the close reason once the job is closed.
  absl::StatusOr<const BackendLossStats*> LossesWhilePlanning() const ABSL_LOCKS_EXCLUDED(mu_);
  void DescribeLocked(v1::Job* job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A mixture job restored or rewound to the start of `epoch`: hands the planner the state of
  // its groups that the start holds (null, or not a mixture job: nothing to do). DATA_LOSS,
  // nothing handed, if it is another epoch's (naming both) or does not fit the job's groups.
  absl::Status RememberMixtureStart(const state::MixtureState* start, uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const JobConfig config_;
  ComputeBackend* const backend_;
  // In memory or journal-backed; thread-safe on its own.
  const std::unique_ptr<EpochHistory> history_;
  // Thread-safe on its own; never called with mu_ held (its `done` callbacks take mu_).
  EpochPlanner planner_;
  // Thread-safe on its own; its lock is taken after mu_ (ClaimRank), never before it.
  RankClaims claims_;

  mutable absl::Mutex mu_;
  JobPhase phase_ ABSL_GUARDED_BY(mu_);  // Changed by Enter only.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Base weights (mean 1) for STATIC / CLASS_BALANCED, the backend's; null for UNIFORM.
  // Replaced only before the job starts, or by a rewind.
  std::shared_ptr<const BackendWeights> base_ ABSL_GUARDED_BY(mu_);
  // REDUCIBLE_LOSS: the irreducible losses (N floats, host memory), null until uploaded.
  // Replaced only before the job starts; the planner reads a shared copy (RecomputeInputs).
  std::shared_ptr<const std::vector<float>> irreducible_ ABSL_GUARDED_BY(mu_);
  // REDUCIBLE_LOSS with a STATIC or CLASS_BALANCED base: base weights uploaded before the
  // irreducible losses (validated, normalised), planned once those arrive.
  std::optional<std::vector<float>> pending_base_ ABSL_GUARDED_BY(mu_);
  // Per-sample loss statistics, the backend's; only with a loss policy (8 bytes per sample).
  // Made once (MakeLossStats) before the job is used. Written under mu_ while Serving; read off
  // the lock while Planning (LossesWhilePlanning).
  std::unique_ptr<BackendLossStats> losses_ ABSL_GUARDED_BY(mu_);
  // The current deal of epoch_ (its world size is carried into the next epoch's deal 0).
  CurrentDeal deal_ ABSL_GUARDED_BY(mu_);
  // The recorded changes of deal_, each logged in history_ and then applied (one call).
  DealChanges changes_ ABSL_GUARDED_BY(mu_){history_.get(), &deal_};
  WeightSummary weight_summary_ ABSL_GUARDED_BY(mu_);
  // A mixture job's last published epoch (its window's start, with the weights in force, and
  // counts), for Status; null otherwise.
  std::shared_ptr<const MixtureEpoch> mixture_epoch_ ABSL_GUARDED_BY(mu_);
  // A mixture job with an online rule: the serving epoch's per-group loss statistics (24 bytes
  // per group), from the positions accepted (each once); handed to the planner when the epoch
  // closes (MixturePlanner::UpdateOnline). Null for other jobs.
  std::unique_ptr<mixture::GroupLosses> group_losses_ ABSL_GUARDED_BY(mu_);
  // A mixture job with static weights: the weights SetGroupWeights set during the serving
  // epoch (in force from the next one); unset: none.
  std::optional<std::vector<double>> pending_group_weights_ ABSL_GUARDED_BY(mu_);
  // A mixture job: the group weights in force at each epoch up to the last published one
  // (MixtureStatus.history); null for other jobs.
  std::shared_ptr<const WeightHistory> weight_history_ ABSL_GUARDED_BY(mu_);
  double last_recompute_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double last_plan_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // The serving epoch was opened by an EndEpoch and not yet handed to the history after its
  // publication (FinishPlanningNext copies the weights to the host first, off the lock). A
  // rewind waits until it is: a journal's rewind then drops or waits for that snapshot, which
  // would otherwise be written while the rewind removes the files it reads and commits (or land
  // after the rewind, as the newest snapshot of a history the rewind abandoned).
  bool snapshot_unscheduled_ ABSL_GUARDED_BY(mu_) = false;
  // The OnEpochSettled waiters, woken by any change made under mu_ (declared after it: stopped
  // before it goes).
  EpochWaiters waiters_{
      &mu_, [this](uint64_t epoch) ABSL_NO_THREAD_SAFETY_ANALYSIS { return Settled(epoch); }};
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_JOB_H_
