// JobJournal: one job's persisted state, a directory of snapshots and write-ahead logs.
//
//   <dir>/snapshot-<e>.bin  the job's state at the start of epoch e (snapshot.h): spec, base
//                           weights, W_e, loss statistics (a mixture job: its groups' state).
//   <dir>/wal-<e>.log       epoch e's state changes after the snapshot, in the order they were
//                           applied (record_log.h; state.proto WalRecord): loss batches, ranks
//                           that ended the epoch, stream progress, resizes, group weights set.
//   <dir>/rewind-<e>        a rewind to the start of epoch e begun (Rewind); Recover finishes it.
// The job's state is the newest snapshot plus its epoch's log and any later ones, replayed in
// order through the job's own methods (plans and weights are deterministic, so replay gives back
// the same plans). A snapshot is written when an epoch opens; once it is durable the older logs
// are removed, and the older snapshots but the newest KeepEpochStarts() ones (the epoch starts a
// job can be rewound to). A directory without a snapshot belongs to a job whose creation was
// never acknowledged (or was being deleted): Recover removes it.
//
// Damage that recovery detects (DATA_LOSS naming the file) rather than loading less than was
// acknowledged: a log's header is synced when the log is created, before anything is appended
// to it and before a snapshot of its epoch is committed; a new log's header records the length
// of the closed log (all of it synced); each log's head records how far it had been synced
// (record_log.h). So these are DATA_LOSS: the snapshot's epoch's log missing, or any log between
// it and the newest; a log cut short or damaged within what its head or the next log's header
// says had been synced. Not detected (docs/PERSISTENCE.md): the newest log lost whole (or cut
// inside its head) while its epoch has no committed snapshot yet; after a power loss, damage to
// the records that the newest log's last Sync(s) made durable; a job's directory removed whole.
//
// Durability: the Log* methods write to the page cache; a caller acknowledges a change to its
// client only after Sync returned OK.
//
// The order of snapshot and log writes is this class's (docs/CONTRIBUTING.md 17). An epoch starts
// in one of two ways:
//   - opened by the EndEpoch that closed the previous one (that record is in the previous log):
//     OpenEpoch(e) before e is published (the previous log is synced, wal-e opened), then
//     WriteEpochSnapshot(start of e) after it is published, off the boundary's path. Until that
//     snapshot is committed, recovery starts from the older snapshot and replays the logs.
//   - planned by a creation or an upload, which is in no log: StartEpochDurably(start of e)
//     before it is published (the snapshot is committed, then wal-e opened).
//
// Thread-safety: all methods may be called concurrently; Log* calls are written in the order
// they are made (the job makes them under its own lock).
#ifndef SAMPLERD_SERVER_PERSISTENCE_JOB_JOURNAL_H_
#define SAMPLERD_SERVER_PERSISTENCE_JOB_JOURNAL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/compute_backend.h"
#include "kernels/loss_stats.h"
#include "server/loss_batch.h"
#include "server/persistence/record_log.h"
#include "server/persistence/snapshot.h"
#include "server/persistence/state.pb.h"

namespace samplerd {

class JobJournal {
 public:
  // A new job: creates `dir` (removing whatever a previous, unacknowledged job left there).
  static absl::StatusOr<std::unique_ptr<JobJournal>> Create(std::string dir);

  // The state that opens an epoch, as its snapshot holds it.
  struct EpochStart {
    std::string job;   // The job's name.
    std::string spec;  // Its normalised samplerd.v1.JobSpec, serialised.
    uint64_t epoch = 0;
    bool planned = false;                               // False: awaiting an upload (epoch 0 only).
    std::shared_ptr<const std::vector<float>> base;     // Null or empty: none uploaded.
    std::shared_ptr<const std::vector<float>> weights;  // W_epoch; null or empty: uniform.
    std::vector<SampleLossStats> loss_stats;            // Empty: no loss ever applied.
    // REDUCIBLE_LOSS: the irreducible losses (fixed once the job started); null or empty: none.
    std::shared_ptr<const std::vector<float>> irreducible;
    uint64_t samples_seen = 0;
    // The data-parallel world size the epoch starts with; 0: the spec's (older snapshots).
    uint32_t world_size = 0;
    // A mixture job: the state its epoch's window starts from (server/mixture_planner.h); null
    // for other jobs (and in snapshots written before mixture jobs).
    std::shared_ptr<const state::MixtureState> mixture;
    // WriteEpochSnapshot only, instead of loss_stats and samples_seen (which it then fills):
    // derive them from the previous snapshot and the logs of the epochs since. Makes the
    // statistics (host memory, none seen) that the previous snapshot's are restored into and
    // the logged loss batches are applied to, in order, by the job's own rule
    // (BackendLossStats::Apply): the journal keeps no loss rule of its own.
    std::function<absl::StatusOr<std::unique_ptr<BackendLossStats>>()> loss_stats_from_logs;
  };

  // Before epoch `epoch` is published, when an EndEpoch opened it (or when a recovered job
  // publishes its snapshot's epoch): syncs and closes the previous log and makes wal-<epoch>.log
  // the log that the Log* calls write to (appending to it if it exists; a torn tail is cut). If
  // snapshot-<epoch>.bin is committed, the files of earlier epochs are removed. A no-op if
  // wal-<epoch>.log is the current log already; a new log is created with a synced header.
  absl::Status OpenEpoch(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // After `start.epoch` was opened with OpenEpoch and published: writes its snapshot durably and
  // removes the files of earlier epochs (an epoch opened since does not stop it: its own
  // snapshot will supersede this one). With `loss_stats_from_logs`, the loss statistics are
  // those of the newest earlier snapshot with the loss records of its epoch's log and of every
  // later closed epoch's log applied in order: the job's own statistics at the epoch's start,
  // computed off the boundary's path (the job's are written again as soon as the epoch is served).
  // FAILED_PRECONDITION if that epoch's log is not the one open (a later epoch opened meanwhile:
  // its own snapshot will supersede this one).
  absl::Status WriteEpochSnapshot(const EpochStart& start) ABSL_LOCKS_EXCLUDED(mu_);
  // WriteEpochSnapshot on the journal's snapshot thread, so that neither the epoch boundary nor
  // the next one waits for it. Written in the order scheduled; of the starts not yet begun only
  // the newest KeepEpochStarts() are kept (older ones would be removed at once: with one kept,
  // the newest supersedes). A failure is logged; recovery then starts from the older snapshot
  // and the logs, which are kept.
  void ScheduleEpochSnapshot(EpochStart start) ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // Waits until every snapshot scheduled so far is written (or failed, or was dropped).
  void AwaitScheduledSnapshots() ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // Before an epoch planned by a creation or an upload is published: writes its snapshot
  // durably, then (if planned) opens its log.
  absl::Status StartEpochDurably(const EpochStart& start) ABSL_LOCKS_EXCLUDED(mu_);

  // A loss batch encoded for LogLosses, so that the encoding happens before the caller takes its
  // lock (ranks report concurrently).
  class EncodedLosses {
   public:
    explicit EncodedLosses(const LossBatchView& batch);

   private:
    friend class JobJournal;
    std::string bytes_;
  };
  // Records, in the open epoch's log, a state change about to be applied (in the order of
  // application). No-ops while replaying (the records are the journal's own).
  absl::Status LogLosses(const EncodedLosses& batch) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LogRankEnded(uint64_t epoch, uint32_t deal, uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LogStreamed(uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LogResized(uint64_t epoch, uint32_t world_size) ABSL_LOCKS_EXCLUDED(mu_);
  // SetGroupWeights during `epoch`: `weights` (as given) in force from epoch + 1.
  absl::Status LogGroupWeightsSet(uint64_t epoch, absl::Span<const double> weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  // What a recovered log says, one typed call per record, in order. `before_record` is called
  // first with the record's epoch (the job waits for that epoch's plan and checks it is current).
  struct ReplayHandlers {
    std::function<absl::Status(uint64_t epoch)> before_record;
    std::function<absl::Status(const LossBatchView&)> losses;
    std::function<absl::Status(uint64_t epoch, uint32_t deal, uint32_t rank)> rank_ended;
    std::function<absl::Status(uint64_t epoch, uint32_t deal, uint32_t rank, uint64_t position)>
        streamed;
    std::function<absl::Status(uint64_t epoch, uint32_t world_size)> resized;
    std::function<absl::Status(uint64_t epoch, std::vector<double> weights)> group_weights_set;
  };

  struct Recovered {
    // In replay mode (Log* calls are no-ops) until EndReplay; no log open yet: call OpenEpoch.
    std::unique_ptr<JobJournal> journal;
    Snapshot snapshot;  // The newest.
    // The snapshot's epoch's log records and those of later epochs, in order.
    std::vector<state::WalRecord> records;
  };
  // Reads a job's directory. NOT_FOUND when it has no snapshot: the directory is removed if it
  // holds nothing but the journal's files (a job never acknowledged), else left as it is (not a
  // job's). DATA_LOSS naming the file when the newest snapshot or a log is corrupt or missing
  // (see above); FAILED_PRECONDITION for files of another format version. The newest log, if its
  // epoch has no snapshot and its creation never completed, is removed.
  static absl::StatusOr<Recovered> Recover(std::string dir);

  // Feeds `records` (from Recover) to `handlers`. DATA_LOSS naming the directory and the record
  // when a record has no kind or a handler fails.
  absl::Status Replay(const std::vector<state::WalRecord>& records,
                      const ReplayHandlers& handlers) const;
  // Ends replay mode: Log* calls write again.
  void EndReplay() ABSL_LOCKS_EXCLUDED(mu_);

  ~JobJournal();
  JobJournal(const JobJournal&) = delete;
  JobJournal& operator=(const JobJournal&) = delete;

  const std::string& dir() const { return dir_; }

  // ---- The building blocks of the calls above (also used by the journal's own tests).

  // The halves of writing a snapshot (see snapshot.h): the arrays may change once StageSnapshot
  // returned; until CommitSnapshot(epoch) succeeded, the earlier epochs' files are kept, so a
  // crash in between recovers from them (and the logs after them).
  // CommitSnapshot(epoch) first creates wal-<epoch>.log (its header synced) if it does not
  // exist: a committed snapshot always has its log. It does not make it the current log.
  absl::Status StageSnapshot(const state::SnapshotHeader& header, absl::Span<const float> base,
                             absl::Span<const float> weights,
                             absl::Span<const SampleLossStats> loss_stats,
                             absl::Span<const float> irreducible = {});
  absl::Status CommitSnapshot(uint64_t epoch);

  // Appends one serialised state::WalRecord to the current epoch's log. FAILED_PRECONDITION
  // before the first OpenEpoch. After an I/O error every later call fails with it.
  absl::Status Append(absl::string_view record) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every record appended so far durable.
  absl::Status Sync() ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the directory (the job was deleted): waits for a snapshot being written and drops
  // any scheduled one, then removes the snapshots first, so that a crash midway leaves a
  // directory that Recover discards.
  absl::Status Remove() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Epoch starts kept for a rewind.

  // How many epoch starts (snapshots, the newest included) are kept; at least 1. Set before
  // the first snapshot is committed.
  void KeepEpochStarts(uint32_t count) { keep_snapshots_ = std::max<uint32_t>(count, 1); }
  // The epochs whose start is kept, ascending, the newest KeepEpochStarts(): committed
  // snapshots and those scheduled and not yet written (queued, or being written), which are
  // written in order: when an epoch closes right after the previous one opened, the previous
  // epoch's snapshot may still be unwritten while the next one is scheduled.
  absl::StatusOr<std::vector<uint64_t>> KeptEpochStarts() const ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // The epochs of the snapshots scheduled and not yet written (or failed, or dropped), in the
  // order they are written. ReadEpochStart of one of them needs AwaitScheduledSnapshots first.
  std::vector<uint64_t> UnwrittenEpochStarts() const ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // The kept start of `epoch`, as its snapshot holds it (`spec` and `job` included). NOT_FOUND if
  // it is not kept; DATA_LOSS if the file is damaged.
  absl::StatusOr<EpochStart> ReadEpochStart(uint64_t epoch) const;
  // Puts the journal back to the start of `epoch`, whose snapshot must be kept: the snapshots
  // of later epochs and the logs from `epoch` on are removed, and a fresh wal-<epoch>.log is the
  // current log. A scheduled snapshot not yet begun is dropped (one being written is waited
  // for). Durable when it returns: the marker rewind-<epoch> is committed first, and Recover
  // finishes a rewind that a crash interrupted. NOT_FOUND, with nothing changed, if the
  // snapshot is gone (removed since it was listed); any other error may leave the rewind half
  // done: the journal then refuses further writes, and the next Recover finishes it.
  absl::Status Rewind(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);

 private:
  explicit JobJournal(std::string dir, bool replaying = false)
      : dir_(std::move(dir)), replaying_(replaying) {}
  // The snapshot thread's loop: writes the scheduled starts until none is left.
  void WriteScheduledSnapshots() ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // No snapshot is scheduled any more; waits for the thread. With `drop_pending`, a scheduled
  // snapshot not yet begun is not written.
  void StopSnapshots(bool drop_pending) ABSL_LOCKS_EXCLUDED(snapshot_mu_);
  // The loss statistics at the start of `epoch` from the files (see WriteEpochSnapshot).
  absl::Status DeriveLossStats(EpochStart* start) const;
  // Writes `start`'s snapshot to the page cache (StageSnapshot).
  absl::Status StageEpochStart(const EpochStart& start);
  absl::Status Log(const state::WalRecord& record);
  // Append, except in replay mode (the records replayed are the journal's own).
  absl::Status AppendUnlessReplaying(absl::string_view record) ABSL_LOCKS_EXCLUDED(mu_);
  std::string SnapshotPath(uint64_t epoch) const;
  std::string LogPath(uint64_t epoch) const;
  // Creates wal-<epoch>.log, durably, if it is absent and snapshot-<epoch> is staged.
  absl::Status EnsureLogExists(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the logs of epochs before `epoch` (superseded by its snapshot) and the snapshots
  // before the newest keep_snapshots_.
  absl::Status RemoveBefore(uint64_t epoch) const;
  // The file steps of a rewind to `epoch` after its marker is committed (Rewind, and Recover
  // for an interrupted one): removes later snapshots and the logs from `epoch` on, creates a
  // fresh wal-<epoch>.log, then removes the marker.
  static absl::Status FinishRewind(const JobJournal& journal, uint64_t epoch);
  std::string RewindMarkerPath(uint64_t epoch) const;

  const std::string dir_;
  absl::Mutex mu_;
  std::shared_ptr<RecordLogWriter> log_ ABSL_GUARDED_BY(mu_);
  uint64_t log_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // The epoch of log_, if any.
  absl::Status error_ ABSL_GUARDED_BY(mu_);      // Sticky: a previous log failed to sync.
  bool replaying_ ABSL_GUARDED_BY(mu_);

  // The snapshot thread (ScheduleEpochSnapshot). Never held with mu_ (the thread takes mu_).
  std::atomic<uint32_t> keep_snapshots_{1};

  mutable absl::Mutex snapshot_mu_;
  std::thread snapshot_thread_ ABSL_GUARDED_BY(snapshot_mu_);
  bool snapshot_running_ ABSL_GUARDED_BY(snapshot_mu_) = false;
  // The epoch whose snapshot the thread is writing (taken off pending_snapshots_), if any.
  std::optional<uint64_t> writing_epoch_ ABSL_GUARDED_BY(snapshot_mu_);
  bool snapshots_stopped_ ABSL_GUARDED_BY(snapshot_mu_) = false;
  std::deque<EpochStart> pending_snapshots_ ABSL_GUARDED_BY(snapshot_mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERSISTENCE_JOB_JOURNAL_H_
