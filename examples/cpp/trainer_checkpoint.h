// A trainer rank's checkpoint file for the C++ examples: where its EpochLoop stands
// (EpochLoop::Checkpoint(), a ReaderPosition) and the model's state (opaque bytes of the
// trainer's own format), in one file that is replaced atomically, so that a process killed at any
// moment leaves either the previous checkpoint or the new one, never a torn one.
//
// The file (version 1):
//
//   samplerd.TrainerCheckpoint version=1
//   <ReaderPosition::Serialize(), one line>
//   model_bytes=<n>
//   <n bytes of model state>
//
// SaveTrainerCheckpoint writes "<path>.tmp", fsyncs it, renames it over <path> and fsyncs the
// directory (the server's snapshots are written the same way: docs/PERSISTENCE.md).
//
// When to save (EpochLoop's contract, client/cpp/epoch_loop.h "Checkpoints"): at the start of a
// step, before training on that step's batch (the model then holds exactly the batches before
// the position), or in the ShardEnd hook. A restarted rank loads the file and passes the position
// to EpochLoop::Resume with the model restored: the batches after the position are read and
// trained again, and their losses, already reported by the killed process, count once on the
// server (LossReporter's exactly-once contract).
#ifndef SAMPLERD_EXAMPLES_CPP_TRAINER_CHECKPOINT_H_
#define SAMPLERD_EXAMPLES_CPP_TRAINER_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/reader_position.h"

namespace samplerd {
namespace examples {

struct TrainerCheckpoint {
  ReaderPosition position;
  std::string model;  // The trainer's model state, any bytes.
};

// Replaces `path` with `checkpoint` durably (see above). The OS error naming the path and the
// call (INTERNAL; RESOURCE_EXHAUSTED for a full disk) if it cannot; `path` is then unchanged.
absl::Status SaveTrainerCheckpoint(const std::string& path, const TrainerCheckpoint& checkpoint);

// The checkpoint in `path`. NOT_FOUND if there is none (a first start); DATA_LOSS naming the
// path and what is wrong for a file that is not one of SaveTrainerCheckpoint's (another header
// or version, a bad position line -- ReaderPosition::Parse's message --, a model length that
// does not match the bytes that follow); the OS error otherwise.
absl::StatusOr<TrainerCheckpoint> LoadTrainerCheckpoint(const std::string& path);

}  // namespace examples
}  // namespace samplerd

#endif  // SAMPLERD_EXAMPLES_CPP_TRAINER_CHECKPOINT_H_
