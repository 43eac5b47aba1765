#include "examples/cpp/checkpointed_loop.h"

#include <utility>

namespace samplerd {
namespace examples {

absl::StatusOr<std::optional<TrainerCheckpoint>> LoadCheckpointIfAny(
    const CheckpointOptions& options) {
  if (options.path.empty()) return std::optional<TrainerCheckpoint>();
  absl::StatusOr<TrainerCheckpoint> saved = LoadTrainerCheckpoint(options.path);
  if (absl::IsNotFound(saved.status())) return std::optional<TrainerCheckpoint>();
  if (!saved.ok()) return saved.status();
  return std::optional<TrainerCheckpoint>(*std::move(saved));
}

std::optional<ReaderPosition> ResumeFrom(const std::optional<TrainerCheckpoint>& saved) {
  if (!saved.has_value()) return std::nullopt;
  return saved->position;
}

absl::Status RunWithCheckpoints(EpochLoop& loop, const CheckpointOptions& options,
                                const std::optional<ReaderPosition>& resume_from,
                                uint64_t current_epoch, uint64_t epochs,
                                const std::function<absl::StatusOr<std::string>()>& save_model,
                                const EpochLoop::Step& step,
                                const EpochLoop::ShardEndHook& on_shard_end,
                                const std::function<void(const ReaderPosition&)>& on_saved) {
  // Saves where the loop stands with the model (which holds exactly the batches before it).
  const auto save = [&]() -> absl::Status {
    if (options.path.empty()) return absl::OkStatus();
    absl::StatusOr<ReaderPosition> at = loop.Checkpoint();
    if (!at.ok()) return at.status();
    absl::StatusOr<std::string> model = save_model();
    if (!model.ok()) return model.status();
    if (absl::Status s = SaveTrainerCheckpoint(options.path, {*at, *std::move(model)}); !s.ok()) {
      return s;
    }
    if (on_saved) on_saved(*at);
    return absl::OkStatus();
  };
  uint64_t steps_in_shard = 0;
  uint64_t shard_epoch = UINT64_MAX;
  const EpochLoop::Step saving_step = [&](const EpochBatch& batch,
                                          LossSink& losses) -> absl::Status {
    if (batch.epoch != shard_epoch) {
      shard_epoch = batch.epoch;
      steps_in_shard = 0;
    }
    if (options.every_steps > 0 && steps_in_shard > 0 &&
        steps_in_shard % options.every_steps == 0) {
      if (absl::Status s = save(); !s.ok()) return s;
    }
    ++steps_in_shard;
    return step(batch, losses);
  };
  const EpochLoop::ShardEndHook saving_end = [&](const ShardEnd& end) -> absl::Status {
    if (absl::Status s = save(); !s.ok()) return s;
    return on_shard_end ? on_shard_end(end) : absl::OkStatus();
  };
  if (resume_from.has_value()) {
    if (resume_from->epoch >= epochs) return absl::OkStatus();  // After the last epoch's shard.
    return loop.Resume(*resume_from, epochs - resume_from->epoch, saving_step, saving_end);
  }
  if (current_epoch >= epochs) return absl::OkStatus();
  return loop.Run(current_epoch, epochs - current_epoch, saving_step, saving_end);
}

}  // namespace examples
}  // namespace samplerd
