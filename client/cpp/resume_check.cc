#include "client/cpp/resume_check.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace samplerd {
namespace {

// "job "j" epoch E rank R: cannot resume position P": the start of every refusal.
std::string Where(const ReaderPosition& from, uint64_t epoch, uint64_t position) {
  return absl::StrCat("job \"", from.job, "\" epoch ", epoch, " rank ", from.rank,
                      ": cannot resume position ", position);
}

// Position `position` of `epoch`, short of the end of its shard (of length `length` if known),
// and the epoch has closed since: the two ways on. `what` says which position that is.
absl::Status ClosedShort(const ReaderPosition& from, uint64_t epoch, uint64_t position,
                         std::optional<uint64_t> length, const std::string& what,
                         const ServerProgress& server) {
  const uint64_t current = server.current_epoch;
  const bool kept = std::find(server.rewindable_epochs.begin(), server.rewindable_epochs.end(),
                              epoch) != server.rewindable_epochs.end();
  const std::string rewind =
      kept ? absl::StrCat("rewind the job to the start of epoch ", epoch,
                          " (SamplerClient::RewindJob(\"", from.job, "\", ", epoch,
                          ") on one rank before the loops start; samplerctl rewind ", from.job, " ",
                          epoch, ") and resume every rank from position 0 of epoch ", epoch,
                          " (EpochLoop::Run(", epoch,
                          ", ...)): the positions before it are trained again, by a model that "
                          "saw them")
           : absl::StrCat(
                 "a rewind to the start of epoch ", epoch, " is no longer possible (kept: ",
                 server.rewindable_epochs.empty() ? "none"
                                                  : absl::StrJoin(server.rewindable_epochs, ", "),
                 "; samplerd --rewind_epochs)");
  const std::string positions =
      length.has_value()
          ? absl::StrCat("positions ", position, " to ", *length - 1, " of its shard")
          : absl::StrCat("the positions of its shard from ", position,
                         " on (the shard's length is unknown: a position saved by a version 1 "
                         "or 2 writer; if it was at the end of its shard, continuing loses "
                         "nothing)");
  return absl::FailedPreconditionError(absl::StrCat(
      Where(from, epoch, position), what, ": epoch ", epoch, " has closed since (job \"", from.job,
      "\" is at epoch ", current, "), so ", positions,
      " can no longer be served: they were trained, and their losses reported, after this "
      "checkpoint by the process that died. Either ",
      rewind, "; or continue with epoch ", current, " without this position (EpochLoop::Run(",
      current, ", ...)): keep the restored model, which never trains those positions"));
}

}  // namespace

absl::StatusOr<ResumeAt> CheckResume(const ReaderPosition& from, const ServerProgress& server) {
  const uint64_t current = server.current_epoch;
  if (from.shard_length.has_value() && from.position > *from.shard_length) {
    return absl::InvalidArgumentError(absl::StrCat(Where(from, from.epoch, from.position),
                                                   ": position is past the shard's length ",
                                                   *from.shard_length, " (deal ", from.deal, ")"));
  }
  if (from.epoch < current) {
    const bool at_end = from.shard_length.has_value() && from.position == *from.shard_length;
    if (!at_end) {
      return ClosedShort(from, from.epoch, from.position, from.shard_length, "", server);
    }
    if (from.epoch + 1 == current) return ResumeAt::kNextEpoch;
    // The next epoch closed too: trained whole by the process that died, never by the model
    // this position was saved with.
    return ClosedShort(from, from.epoch + 1, 0, std::nullopt,
                       absl::StrCat(" (the checkpoint is at the end of epoch ", from.epoch,
                                    "'s shard, position ", from.position, ")"),
                       server);
  }
  if (from.position == 0) return ResumeAt::kPosition;
  if (from.epoch == current && from.deal != server.current_deal) {
    return ResumeAt::kPosition;  // The server's deal check refuses a replaced deal, naming it.
  }
  const uint64_t streamed = from.epoch == current ? server.indices_streamed : 0;
  if (from.position <= streamed) return ResumeAt::kPosition;
  return absl::FailedPreconditionError(absl::StrCat(
      Where(from, from.epoch, from.position), " (deal ", from.deal,
      "): the server streamed this rank only ", streamed, " positions of epoch ", from.epoch,
      " (job \"", from.job, "\" is at epoch ", current, ", deal ", server.current_deal,
      "), so this position predates a rewind of the job (RewindJob) or the job was made again, "
      "and the losses before position ",
      from.position,
      " are no longer counted. After a rewind, resume from a position saved at the start of the "
      "epoch (position 0) or one saved after the rewind; or run epoch ",
      current, " from its start (EpochLoop::Run(", current, ", ...))"));
}

uint64_t PositionsServedAgain(uint64_t epoch, uint32_t deal, const ServerProgress& server) {
  if (epoch != server.current_epoch || deal != server.current_deal) return 0;
  return server.losses_accepted;
}

}  // namespace samplerd
