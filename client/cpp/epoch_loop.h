// EpochLoop: a trainer rank's whole sampling loop in one call -- open each epoch, hand the
// training step its batches of indices, report the step's per-sample losses, and at the end of
// the shard flush the losses and end the epoch -- over a ShardReader and a LossReporter.
//
//   absl::StatusOr<std::unique_ptr<EpochLoop>> loop =
//       EpochLoop::Create(client, "train", rank, world_size);
//   if (!loop.ok()) return loop.status();
//   absl::Status done = (*loop)->Run(/*first_epoch=*/0, /*epochs=*/10,
//       [&](const EpochBatch& batch, LossSink& losses) -> absl::Status {
//         std::vector<float> per_sample = TrainStep(batch.indices);  // the trainer's model
//         return losses.Report(per_sample);
//       });
//
// A trainer that can be restarted saves Checkpoint().Serialize() with its model (e.g. in the
// ShardEnd hook, and every few steps) and, at start, resumes it if there is one:
//
//   absl::StatusOr<ReaderPosition> saved = ReaderPosition::Parse(text);  // From the checkpoint.
//   absl::Status done =
//       saved.ok() ? (*loop)->Resume(*saved, kEpochs - saved->epoch, step, on_shard_end)
//                  : (*loop)->Run(current, kEpochs - current, step, on_shard_end);
//
// (`current`: GetJob's current_epoch; kEpochs counts the job's epochs.) A FAILED_PRECONDITION
// from Resume names the ways on (see Checkpoints below).
//
// What the loop owns, so that a trainer cannot get the order wrong (the module that owns an
// ordering enforces it, rather than leaving calls for every trainer to remember): the losses of
// a shard are flushed (acknowledged, durable on the server) before the rank ends the epoch, and
// every request names the epoch's deal. Elastic groups: the deal of the epoch the job is in
// when the loop is created comes from GetJob (v1::Job::deal; the group's first rank calls
// SamplerClient::ResizeJob before the ranks create their loops), every later epoch is deal 0;
// a position saved by Checkpoint carries its own deal.
//
// Checkpoints: Checkpoint() flushes the losses reported so far and returns where the loop
// stands: after the last batch whose step returned OK, with the shard's length once the epoch is
// open. A trainer saves it with its model at the start of a step (before training on that step's
// batch, which is then read again after a restart), in the ShardEnd hook, or between runs, and a
// restarted trainer passes it to Resume. Losses of later batches that were already reported are
// counted once by the server (LossReporter's exactly-once contract).
//
// Resume checks the position against the job's state first (client/cpp/resume_check.h, the
// rule; the Python client's load_state_dict applies the same), so that a restart never goes
// wrong silently:
//   - a position at the end of its shard whose epoch has closed since (saved in the ShardEnd
//     hook or after the last step, then the epoch ended, then the process died): the loop goes
//     on with the next epoch from its start;
//   - a position short of the end of an epoch that has closed since: FAILED_PRECONDITION naming
//     job, epoch, rank, position and the two ways on (rewind the job to that epoch's start if
//     kept -- SamplerClient::RewindJob, `samplerctl rewind JOB EPOCH` -- and resume every rank
//     from position 0 of it; or Run the job's current epoch without this position);
//   - a position past 0 that the server's record of the rank cannot hold (it predates a rewind
//     of the job, or the job was made again): FAILED_PRECONDITION naming what the server
//     streamed and what to do.
//
// Restarts without a checkpoint: Run reads its first epoch from position 0. If that epoch is the
// job's current one (in the deal Run reads it in) and the server already accepted losses of this
// rank in it -- a previous process of the rank trained part of its shard (or all of it, and ended
// the epoch while other ranks are still in it) and died, and this one starts without Resume --
// those positions are served and trained again (their losses count once, as duplicates). Run
// says so before it reads: a warning naming the job, the epoch, the rank and the count
// (EpochLoopOptions::on_restart_warning; standard error by default), counted in
// restart_summary().served_again; or, with EpochLoopOptions::restart_warnings_are_errors,
// FAILED_PRECONDITION with the same words and nothing read. The rule is PositionsServedAgain
// (client/cpp/resume_check.h), the Python sampler's too (its RestartWarning at the first
// iteration without load_state_dict, restart_summary["served_again"]). Resume replays only the
// positions after the checkpoint, as documented above: not counted.
//
// Errors (absl::Status, never exceptions): Create refuses bad arguments with INVALID_ARGUMENT
// naming the field and its value, and an unknown job (NOT_FOUND) or a world size the job's
// current epoch is not dealt to (FAILED_PRECONDITION). Run/Resume stop at the first error and
// return it: the step's own error (same code, message prefixed with job, epoch, rank and batch
// position), the reader's (an epoch that cannot be opened, a stream whose retries ran out), the
// reporter's (a loss the server refused), or EndEpoch's. After a step error the loop can go on
// (Resume(Checkpoint())); after a reporter error it cannot (the reporter's errors are sticky:
// make a new loop and resume from the last checkpoint).
//
// Thread safety: an EpochLoop belongs to one training thread; its methods must not be called
// concurrently (Checkpoint may be called from inside the step, which runs on that thread). Each
// rank has its own loop; loops of several ranks may share one SamplerClient.
//
// Rank claims: Create claims the rank on the server (RankClaim, client/cpp/rank_claim.h) and the
// loop holds the claim until it is destroyed; its reader, reporter and EndEpoch calls carry it. A
// second live process whose loop claims the same rank gets FAILED_PRECONDITION from Create,
// naming the job, the rank and the holder, before anything is streamed to it; a process that
// dies releases its claim with its connection, so its replacement is accepted at once.
// Tensor/pipeline peers of one data-parallel rank set EpochLoopOptions::peer.
//
// Ownership: the loop keeps `client` alive (shared) and owns its claim, reader and reporter; the
// destructor stops the reader, closes the reporter (flushing what was reported), then releases
// the claim.
#ifndef SAMPLERD_CLIENT_CPP_EPOCH_LOOP_H_
#define SAMPLERD_CLIENT_CPP_EPOCH_LOOP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/device_port.h"  // DeviceStream: cudaStream_t, without the CUDA headers.
#include "client/cpp/loss_reporter.h"
#include "client/cpp/rank_claim.h"
#include "client/cpp/reader_position.h"
#include "client/cpp/resume_check.h"
#include "client/cpp/sampler_client.h"
#include "client/cpp/shard_reader.h"

namespace samplerd {

struct EpochLoopOptions {
  // Indices per step (the last batch of a shard may be shorter), 1 to queue_capacity.
  size_t batch_size = 512;
  // Device delivery: when set, every batch's indices are also copied to `device_indices`
  // (device memory of at least batch_size int64_t, owned by the caller) on `device_stream`
  // (ShardReader::NextToDevice), and EpochBatch::device_indices points there. Without a usable
  // GPU, Run returns FAILED_PRECONDITION with the CUDA runtime's reason (in the CPU-only library,
  // //client/cpp:trainer_cpu, always).
  int64_t* device_indices = nullptr;
  DeviceStream device_stream = nullptr;
  // The reader's prefetch (ShardReaderOptions' fields of the same names and defaults).
  size_t queue_capacity = ShardReaderOptions().queue_capacity;
  uint32_t max_chunk_size = ShardReaderOptions().max_chunk_size;
  int device_staging_slots = ShardReaderOptions().device_staging_slots;
  // The loss reporter's buffers and batching (its `claim` is the loop's own).
  LossReporterOptions reporter;
  // This process is one of several tensor/pipeline/context-parallel peers of one data-parallel
  // rank, which read the same shard: every peer sets it, and they hold the rank together (see
  // "Rank claims" above).
  bool peer = false;
  // Where the loop's restart warnings go (see "Restarts without a checkpoint" above): the whole
  // message, called on the training thread. Null: one line "samplerd restart warning: <message>"
  // on standard error.
  std::function<void(const std::string& message)> on_restart_warning;
  // Refuse instead of warning: Run returns FAILED_PRECONDITION with the warning's words before
  // reading anything (a trainer that must never train a position twice silently; the Python
  // client's warnings.simplefilter("error", samplerd.RestartWarning)).
  bool restart_warnings_are_errors = false;
};

// What restarts cost a loop so far, as the warnings said it (the C++ side of the Python sampler's
// restart_summary; the other counts there have no C++ counterpart yet).
struct RestartSummary {
  // Positions Run served again that the server already had losses of this rank for (see
  // "Restarts without a checkpoint" above): summed over the loop's Runs, also those refused.
  uint64_t served_again = 0;
};

// One batch handed to the step: `indices` are this rank's shard positions
// [position, position + indices.size()) of `epoch`, in order.
struct EpochBatch {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t shard_length = 0;
  // Host copy; valid during the step only.
  absl::Span<const uint64_t> indices;
  // EpochLoopOptions::device_indices holding the same indices (ready on device_stream), or null
  // without device delivery.
  const int64_t* device_indices = nullptr;
};

// Reports the losses of the batch it was handed with (at most once per batch). Valid during the
// step only; the step may also report nothing (an evaluation pass, a job without a loss policy).
class LossSink {
 public:
  // losses[k] is the loss of batch.indices[k]. INVALID_ARGUMENT naming losses.size() if it is not
  // the batch's size; FAILED_PRECONDITION if this batch was already reported; otherwise what
  // LossReporter::Report returns (a NaN or negative loss is INVALID_ARGUMENT at the call).
  absl::Status Report(absl::Span<const float> losses);
  // The same for `d_losses`, `batch.indices.size()` floats in device memory, computed on (or
  // ready before the current point of) EpochLoopOptions::device_stream: enqueued there with the
  // batch's device indices (LossReporter::ReportFromDevice), never synchronising the stream.
  // FAILED_PRECONDITION without device delivery.
  absl::Status ReportFromDevice(const float* d_losses);

 private:
  friend class EpochLoop;
  LossSink(LossReporter* reporter, const EpochBatch* batch, DeviceStream stream)
      : reporter_(reporter), batch_(batch), stream_(stream) {}
  absl::Status CheckUnreported() const;

  LossReporter* const reporter_;
  const EpochBatch* const batch_;
  const DeviceStream stream_;
  bool reported_ = false;
};

// What the loop knows when a rank reaches the end of its shard of an epoch: its losses are
// flushed, the epoch is not yet ended (the hook runs before EndEpoch, so every rank's progress
// is still visible in GetJobStatus; a trainer evaluates or all-reduces its metrics here).
struct ShardEnd {
  uint64_t epoch = 0;
  uint32_t deal = 0;
  uint64_t shard_length = 0;
  uint64_t batches = 0;  // Steps this run took in the epoch (fewer after a Resume mid-epoch).
  LossCounts losses;     // The reporter's counts over the loop's life (server summaries).
};

class EpochLoop {
 public:
  // The step: one training step on `batch`, reporting its losses through `losses`. A non-OK
  // return stops the loop (see Errors above).
  using Step = std::function<absl::Status(const EpochBatch& batch, LossSink& losses)>;
  // Called at the end of each shard (see ShardEnd); a non-OK return stops the loop before
  // EndEpoch.
  using ShardEndHook = std::function<absl::Status(const ShardEnd& end)>;

  // A loop for data-parallel rank `rank` of `world_size` on `job`. Contacts the server (claims
  // the rank, GetJob, and LossReporter::Create): FAILED_PRECONDITION if another live process
  // holds the rank (see "Rank claims" above). INVALID_ARGUMENT naming the field and its value: null
  // client, batch_size 0 or above queue_capacity, a device_stream without device_indices (a null
  // device_stream with device_indices is the default stream), and what ShardReader::Create and
  // LossReporter::Create refuse (empty job, rank >= world_size, their options).
  static absl::StatusOr<std::unique_ptr<EpochLoop>> Create(std::shared_ptr<SamplerClient> client,
                                                           const std::string& job, uint32_t rank,
                                                           uint32_t world_size,
                                                           EpochLoopOptions options = {});
  ~EpochLoop();
  EpochLoop(const EpochLoop&) = delete;
  EpochLoop& operator=(const EpochLoop&) = delete;

  // Reads epochs first_epoch .. first_epoch + epochs - 1 from their start: for each, every batch
  // of the shard through `step`, then `on_shard_end` (if set), then EndEpoch. Opening an epoch
  // waits (up to ClientOptions::timeout) until every rank has ended the previous one. First
  // (GetJobStatus), a start that serves positions again is warned of or refused: see "Restarts
  // without a checkpoint" above. epochs = 0 does nothing.
  absl::Status Run(uint64_t first_epoch, uint64_t epochs, const Step& step,
                   const ShardEndHook& on_shard_end = nullptr);

  // As Run, continuing from `from` (a Checkpoint of this job's rank, maybe of a previous
  // process): the rest of from.epoch's shard, then the epochs up to from.epoch + epochs - 1.
  // Before reading, `from` is checked against the job's state (GetJobStatus; GetJob for the
  // shard's length if `from` does not carry it): see Checkpoints above. A position at the end of
  // a closed epoch's shard reads nothing of that epoch (no hook, no EndEpoch: it closed), which
  // still counts as one of `epochs`; such a position may also be one of a group of another size
  // (an elastic restart right after an epoch boundary: the next epoch is dealt to this group).
  // Errors: INVALID_ARGUMENT or FAILED_PRECONDITION (ReaderPosition::CheckOwner) for a position
  // of another job, rank or world size (but for the case above), and
  // CheckResume's refusals (FAILED_PRECONDITION, naming what to do), before anything is read;
  // then Run's. epochs = 0 does nothing.
  absl::Status Resume(const ReaderPosition& from, uint64_t epochs, const Step& step,
                      const ShardEndHook& on_shard_end = nullptr);

  // Flushes the losses reported so far and returns where the loop stands: after the last batch
  // whose step returned OK (so a step that failed is read again by Resume), or the start of the
  // next epoch once an epoch was ended; with ReaderPosition::shard_length once the epoch is open
  // (in the ShardEnd hook: position = shard_length). FAILED_PRECONDITION before the first Run; the
  // reporter's error.
  absl::StatusOr<ReaderPosition> Checkpoint();

  // The restarts this loop warned of (or refused), counted since Create.
  const RestartSummary& restart_summary() const { return restart_summary_; }

 private:
  EpochLoop(std::shared_ptr<SamplerClient> client, EpochLoopOptions options,
            std::unique_ptr<RankClaim> claim, std::unique_ptr<ShardReader> reader,
            std::unique_ptr<LossReporter> reporter, uint64_t dealt_epoch, uint32_t dealt_deal);

  // Position 0 of `epoch` in the deal the loop reads it in.
  ReaderPosition StartOf(uint64_t epoch) const;
  // The server's facts of this rank and the job now (GetJobStatus).
  absl::StatusOr<ServerProgress> ProgressOnServer() const;
  // CheckResume of `from` with the server's facts.
  absl::StatusOr<ResumeAt> CheckResumable(const ReaderPosition& from) const;
  // Run's check of `start` (position 0, no checkpoint): PositionsServedAgain with the server's
  // facts, warned of and counted, or refused (see "Restarts without a checkpoint").
  absl::Status CheckServedAgain(const ReaderPosition& start);
  // Reads `from.epoch` from `from.position` in deal `from.deal`, then the following epochs.
  absl::Status RunFrom(const ReaderPosition& from, uint64_t epochs, const Step& step,
                       const ShardEndHook& on_shard_end);
  // The shard of the epoch the reader has open (at `*checkpoint_`) to its end, then the hook and
  // EndEpoch.
  absl::Status ReadShard(const Step& step, const ShardEndHook& on_shard_end);
  // `status` with the job, epoch, rank and shard position prefixed to its message.
  absl::Status Annotate(const absl::Status& status, const char* what) const;
  // The deal an epoch opened from its start is read in (see the header comment).
  uint32_t DealOf(uint64_t epoch) const { return epoch == dealt_epoch_ ? dealt_deal_ : 0; }

  const std::shared_ptr<SamplerClient> client_;
  const EpochLoopOptions options_;
  // Before the reader and the reporter, which use it: destroyed after them.
  const std::unique_ptr<RankClaim> claim_;
  const std::unique_ptr<ShardReader> reader_;
  const std::unique_ptr<LossReporter> reporter_;
  // The reader's (job, rank, world_size) are the loop's: reader_->options().
  // The job's current epoch and its deal when the loop was created.
  const uint64_t dealt_epoch_;
  const uint32_t dealt_deal_;

  // What Checkpoint returns: after the last batch whose step returned OK (in the epoch open), or
  // the start of the next epoch once one was ended. Empty before the first Run.
  std::optional<ReaderPosition> checkpoint_;
  RestartSummary restart_summary_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_EPOCH_LOOP_H_
