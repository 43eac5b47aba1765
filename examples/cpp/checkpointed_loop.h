// RunWithCheckpoints: a trainer rank's EpochLoop with a checkpoint file -- the examples' one home
// of when a checkpoint is saved and of how a restarted rank goes on (cpu_trainer, ddp_trainer):
//
//   absl::StatusOr<std::optional<TrainerCheckpoint>> saved = LoadCheckpointIfAny(options);
//   if (saved->has_value()) model.Restore((*saved)->model);   // The trainer's own format.
//   absl::Status done = RunWithCheckpoints(loop, options, ResumeFrom(*saved), current_epoch,
//                                          epochs, [&] { return model.Serialize(); }, step,
//                                          on_shard_end, on_saved);
//
// When (EpochLoop's contract, client/cpp/epoch_loop.h "Checkpoints"): at the start of every
// options.every_steps-th step of a shard, before that step trains (the model then holds exactly
// the batches before the saved position), and at every end of shard (in the ShardEnd hook, before
// the trainer's own hook and EndEpoch). What: EpochLoop::Checkpoint() (losses flushed, the
// ReaderPosition) and the model's bytes, in one file replaced atomically
// (trainer_checkpoint.h). How a restart goes on: EpochLoop::Resume of the saved position, which
// checks it against the job's state first (a refusal names the ways on); without a checkpoint,
// EpochLoop::Run of the job's current epoch, which says how many positions it serves again if a
// previous process of the rank had trained part of it (EpochLoop::restart_summary()).
#ifndef SAMPLERD_EXAMPLES_CPP_CHECKPOINTED_LOOP_H_
#define SAMPLERD_EXAMPLES_CPP_CHECKPOINTED_LOOP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/reader_position.h"
#include "examples/cpp/trainer_checkpoint.h"

namespace samplerd {
namespace examples {

struct CheckpointOptions {
  // This rank's checkpoint file; empty: no checkpoints, and a start is always a first start.
  std::string path;
  // Save at the start of every this many steps of a shard (0: at ends of shard only).
  uint64_t every_steps = 4;
};

// The rank's checkpoint: nullopt at a first start (no path, or no file there);
// LoadTrainerCheckpoint's errors otherwise (DATA_LOSS naming the path for a damaged file).
absl::StatusOr<std::optional<TrainerCheckpoint>> LoadCheckpointIfAny(
    const CheckpointOptions& options);

// The position a loaded checkpoint resumes, if any.
std::optional<ReaderPosition> ResumeFrom(const std::optional<TrainerCheckpoint>& saved);

// Trains the job's epochs up to `epochs` (exclusive) on `loop`, saving as above: from
// `*resume_from` (EpochLoop::Resume; the caller restored the model saved with it) or else from
// `current_epoch` (EpochLoop::Run). Nothing is trained (OK) when that epoch is >= `epochs` (a
// checkpoint saved after the last epoch's shard). `save_model`: the model's bytes now (called on
// the training thread between steps); `on_saved(position)` after each save (may be null).
// Errors: the loop's, the model's, and SaveTrainerCheckpoint's (the file is then unchanged).
absl::Status RunWithCheckpoints(EpochLoop& loop, const CheckpointOptions& options,
                                const std::optional<ReaderPosition>& resume_from,
                                uint64_t current_epoch, uint64_t epochs,
                                const std::function<absl::StatusOr<std::string>()>& save_model,
                                const EpochLoop::Step& step,
                                const EpochLoop::ShardEndHook& on_shard_end,
                                const std::function<void(const ReaderPosition&)>& on_saved);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_CHECKPOINTED_LOOP_H_
