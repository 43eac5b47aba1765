// A data-parallel trainer rank on the CPU (README "C++ trainer that restarts"): samplerd's
// CPU-only trainer library (//client/cpp:trainer_cpu) driving a toy model through EpochLoop, one
// process per rank, with checkpoints it resumes from after a crash. The model needs no collective
// library: each rank fits its own scalar to the samples it is dealt, and reports per-sample
// losses, so the job's LOSS policy steers the next epoch's plan.
//
//   cpu_trainer --address=localhost:50051 --job=toy --rank=R --world_size=2
//       --num_samples=4000 --epochs=3 --checkpoint_file=/tmp/toy.rank-R.ckpt
//
// At start a rank that finds --checkpoint_file resumes from it (EpochLoop::Resume, with the model
// it saved); without one it starts the job (CreateJob, idempotent: every rank calls it with the
// same spec and they share one job; an existing job is never deleted) and runs from the job's
// current epoch. It saves (examples/cpp/trainer_checkpoint.h) at the start of every
// --checkpoint_every-th step of a shard and at every end of shard: RunWithCheckpoints
// (examples/cpp/checkpointed_loop.h), the examples' one home of that, which ddp_trainer uses too.
//
// Output, one line each, flushed (tests/cpu_trainer_process_test reads it):
//   resumed epoch=E position=P          started from a checkpoint
//   checkpoint epoch=E position=P       a checkpoint is on disk
//   trained epoch=E position=P n=N      a step trained positions [P, P+N) of its shard
//   shard_end epoch=E shard_length=L losses_accepted=A
//                                        end of shard; A: the server's count for this rank
//   restart_summary served_again=S      before "done": the positions this process was served
//                                        again (EpochLoop::restart_summary(): a restart without
//                                        its checkpoint file that ran a half-streamed epoch from
//                                        position 0; its warning is on stderr)
//   done model w=<hex float>            every epoch ended; the final model, exact
// An error ends the process with exit 1 and "error <what>: <status>" on stderr. With
// --restart_warnings_are_errors such a restart is that error instead (FAILED_PRECONDITION).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "examples/cpp/checkpointed_loop.h"
#include "examples/cpp/trainer_checkpoint.h"

ABSL_FLAG(std::string, address, "localhost:50051", "samplerd host:port");
ABSL_FLAG(std::string, job, "toy", "job name");
ABSL_FLAG(uint32_t, rank, 0, "this process's data-parallel rank");
ABSL_FLAG(uint32_t, world_size, 1, "ranks in the group");
ABSL_FLAG(uint64_t, num_samples, 4000, "the job's samples (the toy data set)");
ABSL_FLAG(uint64_t, seed, 7, "the job's seed");
ABSL_FLAG(uint64_t, epochs, 3, "epochs the job trains");
ABSL_FLAG(uint64_t, batch, 50, "indices per step");
ABSL_FLAG(std::string, checkpoint_file, "",
          "this rank's checkpoint: resumed from at start if it exists, rewritten while training "
          "(empty: no checkpoints)");
ABSL_FLAG(uint64_t, checkpoint_every, 4,
          "save at the start of every this many steps of a shard (0: at ends of shard only)");
ABSL_FLAG(uint64_t, step_ms, 0, "simulated compute time per step, milliseconds");
ABSL_FLAG(bool, restart_warnings_are_errors, false,
          "refuse to train positions again that a previous process of this rank trained (a "
          "restart without its checkpoint): EpochLoopOptions::restart_warnings_are_errors");

namespace samplerd {
namespace examples {
namespace {

// The toy data set: sample i's target, a fixed value in [0, 1).
double Target(uint64_t index) {
  return static_cast<double>((index * 2654435761ULL) % 1000003ULL) / 1000003.0;
}

// The toy model: one scalar fitted to the targets of the batches it trains on (SGD on the
// squared error); a sample's loss is its distance to the model, so the LOSS policy deals the
// far ones more often.
class ToyModel {
 public:
  // The batch's per-sample losses (before the update), then one SGD step on it.
  std::vector<float> Train(absl::Span<const uint64_t> indices) {
    std::vector<float> losses;
    losses.reserve(indices.size());
    double mean = 0;
    for (uint64_t index : indices) {
      losses.push_back(static_cast<float>(std::fabs(Target(index) - w_)) + 0.001f);
      mean += Target(index);
    }
    mean /= static_cast<double>(indices.size());
    w_ += 0.05 * (mean - w_);
    return losses;
  }
  // Exact text of the state (C99 hex float), and back.
  std::string Serialize() const { return absl::StrFormat("w=%a", w_); }
  absl::Status Restore(const std::string& text) {
    double w = 0;
    char tail = 0;
    if (std::sscanf(text.c_str(), "w=%la%c", &w, &tail) != 1) {
      return absl::DataLossError(absl::StrCat("model state \"", text, "\" is not \"w=<hex>\""));
    }
    w_ = w;
    return absl::OkStatus();
  }

 private:
  double w_ = 0.5;
};

void Print(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "error %s: %s\n", what, status.ToString().c_str());
  return 1;
}

int Main() {
  const std::string job = absl::GetFlag(FLAGS_job);
  const uint32_t rank = absl::GetFlag(FLAGS_rank);
  const uint32_t world_size = absl::GetFlag(FLAGS_world_size);
  const uint64_t epochs = absl::GetFlag(FLAGS_epochs);
  const std::string checkpoint_file = absl::GetFlag(FLAGS_checkpoint_file);
  const uint64_t checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  const absl::Duration step_time = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));

  absl::StatusOr<std::unique_ptr<SamplerClient>> made =
      SamplerClient::Create(absl::GetFlag(FLAGS_address));
  if (!made.ok()) return Fail("SamplerClient::Create", made.status());
  std::shared_ptr<SamplerClient> client = *std::move(made);

  ToyModel model;
  const CheckpointOptions checkpoints{checkpoint_file, checkpoint_every};
  absl::StatusOr<std::optional<TrainerCheckpoint>> saved = LoadCheckpointIfAny(checkpoints);
  if (!saved.ok()) return Fail("LoadTrainerCheckpoint", saved.status());
  if (saved->has_value()) {
    if (absl::Status s = model.Restore((*saved)->model); !s.ok()) return Fail("checkpoint", s);
  }
  const std::optional<ReaderPosition> resume_from = ResumeFrom(*saved);
  uint64_t current = 0;
  if (resume_from.has_value()) {
    // A restart: the job exists (NOT_FOUND says it went away). Not CreateJob, which refuses a
    // job past epoch 0 without CreateJobRequest.resume.
    absl::StatusOr<v1::Job> existing = client->GetJob(job);
    if (!existing.ok()) return Fail("GetJob", existing.status());
  } else {
    // A first start: every rank creates the job with the same spec and they share it.
    v1::JobSpec spec;
    spec.set_num_samples(absl::GetFlag(FLAGS_num_samples));
    spec.set_world_size(world_size);
    spec.set_seed(absl::GetFlag(FLAGS_seed));
    spec.mutable_policy()->set_loss(v1::LOSS);
    absl::StatusOr<v1::Job> created = client->CreateJob(job, spec);
    if (!created.ok()) return Fail("CreateJob", created.status());
    current = created->current_epoch();
  }

  EpochLoopOptions options;
  options.batch_size = absl::GetFlag(FLAGS_batch);
  options.queue_capacity = std::max<size_t>(options.queue_capacity, options.batch_size);
  options.restart_warnings_are_errors = absl::GetFlag(FLAGS_restart_warnings_are_errors);
  absl::StatusOr<std::unique_ptr<EpochLoop>> created =
      EpochLoop::Create(client, job, rank, world_size, options);
  if (!created.ok()) return Fail("EpochLoop::Create", created.status());
  EpochLoop& loop = **created;

  const auto step = [&](const EpochBatch& batch, LossSink& losses) -> absl::Status {
    absl::SleepFor(step_time);
    if (absl::Status s = losses.Report(model.Train(batch.indices)); !s.ok()) return s;
    Print(absl::StrFormat("trained epoch=%d position=%d n=%d", batch.epoch, batch.position,
                          batch.indices.size()));
    return absl::OkStatus();
  };
  const auto shard_end = [&](const ShardEnd& end) -> absl::Status {
    // After the end-of-shard checkpoint, before EndEpoch: the server still shows this epoch's
    // progress.
    absl::StatusOr<v1::JobStatus> status = client->GetJobStatus(job);
    if (!status.ok()) return status.status();
    uint64_t accepted = 0;
    for (const v1::RankProgress& progress : status->ranks()) {
      if (progress.rank() == rank) accepted = progress.losses_accepted();
    }
    Print(absl::StrFormat("shard_end epoch=%d shard_length=%d losses_accepted=%d", end.epoch,
                          end.shard_length, accepted));
    return absl::OkStatus();
  };

  if (resume_from.has_value()) {
    Print(absl::StrFormat("resumed epoch=%d position=%d", resume_from->epoch,
                          resume_from->position));
  }
  const absl::Status done = RunWithCheckpoints(
      loop, checkpoints, resume_from, current, epochs,
      [&]() -> absl::StatusOr<std::string> { return model.Serialize(); }, step, shard_end,
      [](const ReaderPosition& at) {
        Print(absl::StrFormat("checkpoint epoch=%d position=%d", at.epoch, at.position));
      });
  if (!done.ok()) return Fail("training", done);
  Print(absl::StrFormat("restart_summary served_again=%d", loop.restart_summary().served_again));
  Print("done model " + model.Serialize());
  return 0;
}

}  // namespace
}  // namespace examples
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return samplerd::examples::Main();
}
