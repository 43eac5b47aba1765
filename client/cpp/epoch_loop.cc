#include "client/cpp/epoch_loop.h"

#include <cstdio>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/resume_check.h"

namespace samplerd {

absl::Status LossSink::CheckUnreported() const {
  if (reported_) {
    return absl::FailedPreconditionError(absl::StrCat("the losses of the batch at shard position ",
                                                      batch_->position, " of epoch ", batch_->epoch,
                                                      " were already reported"));
  }
  return absl::OkStatus();
}

absl::Status LossSink::Report(absl::Span<const float> losses) {
  if (absl::Status s = CheckUnreported(); !s.ok()) return s;
  if (losses.size() != batch_->indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "losses.size() = ", losses.size(), ": the batch has ", batch_->indices.size(), " indices"));
  }
  absl::Status s = reporter_->Report(batch_->epoch, batch_->position, batch_->indices, losses);
  // A refused call reported nothing (LossReporter's contract), so it may be corrected.
  reported_ = s.ok();
  return s;
}

absl::Status LossSink::ReportFromDevice(const float* d_losses) {
  if (absl::Status s = CheckUnreported(); !s.ok()) return s;
  if (batch_->device_indices == nullptr) {
    return absl::FailedPreconditionError(
        "ReportFromDevice: the loop delivers no device indices (EpochLoopOptions::device_indices "
        "is null)");
  }
  absl::Status s =
      reporter_->ReportFromDevice(batch_->epoch, batch_->position, batch_->device_indices, d_losses,
                                  batch_->indices.size(), stream_);
  reported_ = s.ok();
  return s;
}

absl::StatusOr<std::unique_ptr<EpochLoop>> EpochLoop::Create(std::shared_ptr<SamplerClient> client,
                                                             const std::string& job, uint32_t rank,
                                                             uint32_t world_size,
                                                             EpochLoopOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("client = null");
  if (options.batch_size == 0 || options.batch_size > options.queue_capacity) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size = ", options.batch_size,
                                                   ": must be 1 to queue_capacity (",
                                                   options.queue_capacity, ")"));
  }
  if (options.device_stream != nullptr && options.device_indices == nullptr) {
    return absl::InvalidArgumentError(
        "device_stream is set but device_indices = null: set both for device delivery");
  }
  // First: a second live process of this rank stops here, before anything is streamed to it.
  absl::StatusOr<std::unique_ptr<RankClaim>> claim =
      RankClaim::Create(client, job, rank, world_size, options.peer);
  if (!claim.ok()) return claim.status();
  ShardReaderOptions reader_options;
  reader_options.claim = claim->get();
  reader_options.job = job;
  reader_options.rank = rank;
  reader_options.world_size = world_size;
  reader_options.queue_capacity = options.queue_capacity;
  reader_options.max_chunk_size = options.max_chunk_size;
  reader_options.device_staging_slots = options.device_staging_slots;
  absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Create(client, reader_options);
  if (!reader.ok()) return reader.status();
  // The deal the group starts in. The reporter asks the server the same (and refuses a world
  // size the current epoch is not dealt to); a resize between the two calls is the group's
  // first rank breaking the contract (resize before the ranks create their loops).
  absl::StatusOr<v1::Job> described = client->GetJob(job);
  if (!described.ok()) return described.status();
  LossReporterOptions reporter_options = options.reporter;
  reporter_options.claim = claim->get();
  absl::StatusOr<std::unique_ptr<LossReporter>> reporter =
      LossReporter::Create(client.get(), job, rank, world_size, reporter_options);
  if (!reporter.ok()) return reporter.status();
  return absl::WrapUnique(new EpochLoop(std::move(client), std::move(options), *std::move(claim),
                                        *std::move(reader), *std::move(reporter),
                                        described->current_epoch(), described->deal()));
}

EpochLoop::EpochLoop(std::shared_ptr<SamplerClient> client, EpochLoopOptions options,
                     std::unique_ptr<RankClaim> claim, std::unique_ptr<ShardReader> reader,
                     std::unique_ptr<LossReporter> reporter, uint64_t dealt_epoch,
                     uint32_t dealt_deal)
    : client_(std::move(client)),
      options_(std::move(options)),
      claim_(std::move(claim)),
      reader_(std::move(reader)),
      reporter_(std::move(reporter)),
      dealt_epoch_(dealt_epoch),
      dealt_deal_(dealt_deal) {}

// Members go in reverse order: the reporter closes (flushing) before the reader stops, and the
// claim is released last.
EpochLoop::~EpochLoop() = default;

ReaderPosition EpochLoop::StartOf(uint64_t epoch) const {
  const ShardReaderOptions& o = reader_->options();
  ReaderPosition start;
  start.job = o.job;
  start.epoch = epoch;
  start.deal = DealOf(epoch);
  start.rank = o.rank;
  start.world_size = o.world_size;
  start.position = 0;
  return start;
}

absl::Status EpochLoop::Run(uint64_t first_epoch, uint64_t epochs, const Step& step,
                            const ShardEndHook& on_shard_end) {
  if (!step) return absl::InvalidArgumentError("step = null");
  if (epochs == 0) return absl::OkStatus();
  const ReaderPosition start = StartOf(first_epoch);
  if (absl::Status s = CheckServedAgain(start); !s.ok()) return s;
  return RunFrom(start, epochs, step, on_shard_end);
}

absl::Status EpochLoop::CheckServedAgain(const ReaderPosition& start) {
  absl::StatusOr<ServerProgress> server = ProgressOnServer();
  if (!server.ok()) return server.status();
  const uint64_t again = PositionsServedAgain(start.epoch, start.deal, *server);
  if (again == 0) return absl::OkStatus();
  restart_summary_.served_again += again;
  const std::string message = absl::StrCat(
      "job \"", start.job, "\" epoch ", start.epoch, " rank ", start.rank, " (deal ", start.deal,
      "): the server already has ", again,
      " losses of this rank in this epoch (a previous process's, or an earlier Run's) and Run "
      "starts at position 0, so ",
      again,
      " positions are served and trained again (their losses count once, as duplicates). A "
      "restarted trainer resumes its checkpoint instead: EpochLoop::Resume with the saved "
      "ReaderPosition (EpochLoop::Checkpoint) and its model");
  if (options_.restart_warnings_are_errors) {
    return absl::FailedPreconditionError(
        absl::StrCat(message,
                     " (refused: EpochLoopOptions::restart_warnings_are_errors; nothing "
                     "was read)"));
  }
  if (options_.on_restart_warning) {
    options_.on_restart_warning(message);
  } else {
    std::fprintf(stderr, "samplerd restart warning: %s\n", message.c_str());
  }
  return absl::OkStatus();
}

absl::Status EpochLoop::Resume(const ReaderPosition& from, uint64_t epochs, const Step& step,
                               const ShardEndHook& on_shard_end) {
  if (!step) return absl::InvalidArgumentError("step = null");
  if (epochs == 0) return absl::OkStatus();
  const ShardReaderOptions& o = reader_->options();
  const absl::Status owner = from.CheckOwner(o.job, o.rank, o.world_size);
  // A position of this job saved by a group of another size names no position of this group's
  // shards -- unless it is the end of a shard whose epoch has closed since: nothing of it is
  // left, and the next epoch is dealt to this group (as the Python client's load_state_dict).
  const bool other_group = from.job == o.job && from.world_size != o.world_size;
  if (!owner.ok() && !other_group) return owner;
  absl::StatusOr<ResumeAt> at = CheckResumable(from);
  if (!owner.ok() && !(at.ok() && *at == ResumeAt::kNextEpoch)) return owner;
  if (!at.ok()) return at.status();
  if (*at == ResumeAt::kPosition) return RunFrom(from, epochs, step, on_shard_end);
  // Nothing is left of from.epoch (it closed with this shard consumed): it counts as one of
  // `epochs`, and the next one is read from its start.
  checkpoint_ = StartOf(from.epoch + 1);
  return RunFrom(*checkpoint_, epochs - 1, step, on_shard_end);
}

absl::StatusOr<ServerProgress> EpochLoop::ProgressOnServer() const {
  const ShardReaderOptions& o = reader_->options();
  // The ranks' progress is the current epoch's, also while it is planned (none then:
  // v1::JobStatus::planning), so there is nothing to wait for.
  absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(o.job);
  if (!status.ok()) return status.status();
  ServerProgress server;
  server.current_epoch = status->job().current_epoch();
  server.current_deal = status->job().deal();
  server.rewindable_epochs.assign(status->job().rewindable_epochs().begin(),
                                  status->job().rewindable_epochs().end());
  for (const v1::RankProgress& rank : status->ranks()) {
    if (rank.rank() != o.rank) continue;
    server.indices_streamed = rank.indices_streamed();
    server.losses_accepted = rank.losses_accepted();
  }
  return server;
}

absl::StatusOr<ResumeAt> EpochLoop::CheckResumable(const ReaderPosition& from) const {
  const ShardReaderOptions& o = reader_->options();
  absl::StatusOr<ServerProgress> progress = ProgressOnServer();
  if (!progress.ok()) return progress.status();
  const ServerProgress& server = *progress;
  ReaderPosition checked = from;
  // A position without its shard's length (a version 1 or 2 text): the server's, for an epoch it
  // still answers about (the current one in the position's deal, or a later one).
  if (!checked.shard_length.has_value() && from.position > 0 &&
      (from.epoch > server.current_epoch ||
       (from.epoch == server.current_epoch && from.deal == server.current_deal))) {
    absl::StatusOr<v1::Job> described = client_->GetJob(o.job, o.rank, from.epoch);
    if (described.ok() && described->has_shard_length()) {
      checked.shard_length = described->shard_length();
    } else if (!described.ok() && !absl::IsFailedPrecondition(described.status()) &&
               !absl::IsInvalidArgument(described.status())) {
      return described.status();  // Unknown otherwise (closed meanwhile, another world size).
    }
  }
  return CheckResume(checked, server);
}

absl::Status EpochLoop::RunFrom(const ReaderPosition& from, uint64_t epochs, const Step& step,
                                const ShardEndHook& on_shard_end) {
  if (!step) return absl::InvalidArgumentError("step = null");
  ReaderPosition start = from;
  for (uint64_t i = 0; i < epochs; ++i) {
    // Checks that `start` is this reader's job, rank and world size, and opens the epoch.
    if (absl::Status s = reader_->Resume(start); !s.ok()) return s;
    // The reader's position: `start` with the shard's length, which the server said on opening.
    absl::StatusOr<ReaderPosition> opened = reader_->position();
    if (!opened.ok()) return opened.status();
    checkpoint_ = *std::move(opened);
    if (absl::Status s = ReadShard(step, on_shard_end); !s.ok()) return s;
    start = StartOf(start.epoch + 1);
    checkpoint_ = start;
  }
  return absl::OkStatus();
}

absl::Status EpochLoop::Annotate(const absl::Status& status, const char* what) const {
  const ShardReaderOptions& o = reader_->options();
  return absl::Status(
      status.code(),
      absl::StrCat("job \"", o.job, "\" epoch ", checkpoint_->epoch, " rank ", o.rank, ": ", what,
                   " at shard position ", checkpoint_->position, ": ", status.message()));
}

absl::Status EpochLoop::ReadShard(const Step& step, const ShardEndHook& on_shard_end) {
  ShardEnd end;
  end.epoch = checkpoint_->epoch;
  end.deal = checkpoint_->deal;
  for (;;) {
    absl::StatusOr<ShardBatch> next =
        options_.device_indices == nullptr
            ? reader_->Next(options_.batch_size)
            : reader_->NextToDevice(options_.batch_size, options_.device_indices,
                                    options_.device_stream);
    if (!next.ok()) return next.status();  // The reader names job, epoch, rank and position.
    end.shard_length = next->shard_length;
    if (next->end_of_shard()) break;
    EpochBatch batch;
    batch.epoch = next->epoch;
    batch.position = next->position;
    batch.shard_length = next->shard_length;
    batch.indices = next->indices;
    batch.device_indices = options_.device_indices;
    LossSink losses(reporter_.get(), &batch, options_.device_stream);
    if (absl::Status s = step(batch, losses); !s.ok()) return Annotate(s, "step");
    checkpoint_->position = batch.position + batch.indices.size();
    ++end.batches;
  }
  // Every loss of the shard acknowledged before the rank ends the epoch: the server recomputes
  // the weights from them once the last rank has ended it.
  if (absl::Status s = reporter_->Flush(); !s.ok()) return s;
  end.losses = reporter_->counts();
  if (on_shard_end) {
    if (absl::Status s = on_shard_end(end); !s.ok()) return Annotate(s, "end-of-shard hook");
  }
  const ShardReaderOptions& o = reader_->options();
  absl::StatusOr<v1::EndEpochResponse> ended =
      client_->EndEpoch(o.job, end.epoch, o.rank, end.deal, claim_.get());
  if (!ended.ok()) return Annotate(ended.status(), "EndEpoch");
  return absl::OkStatus();
}

absl::StatusOr<ReaderPosition> EpochLoop::Checkpoint() {
  if (!checkpoint_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job \"", reader_->options().job, "\" rank ",
                                                      reader_->options().rank,
                                                      ": no checkpoint before the first Run"));
  }
  if (absl::Status s = reporter_->Flush(); !s.ok()) return s;
  return *checkpoint_;
}

}  // namespace samplerd
