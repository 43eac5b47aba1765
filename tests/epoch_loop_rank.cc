// One data-parallel rank in its own process, for trainer_process_test: an EpochLoop over
// --epochs epochs from epoch 0, with the client's default options, as a trainer runs it. Its
// step reports a loss for every index.
//
// Handshakes with the test (stdout lines, then a line on stdin to go on), so that the test can
// kill samplerd while every rank waits at a known point:
//   --pause_at=P: at the step of position P of the first epoch, takes a Checkpoint (flushing the
//     losses reported so far), prints "checkpoint epoch=E position=P" and waits.
//   --pause_at_shard_end: at each end of shard (losses flushed, EndEpoch not yet called), prints
//     "shard_end epoch=E accepted=A duplicates=D" (the reporter's counts) and waits.
// Prints "done" when every epoch ended; "error <call>: <status>" (exit 1) on an error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "client/cpp/epoch_loop.h"
#include "client/cpp/sampler_client.h"
#include "tests/rank_flags.h"

ABSL_FLAG(uint64_t, epochs, 1, "epochs to run from epoch 0");
ABSL_FLAG(uint64_t, batch, 250, "indices per step");
ABSL_FLAG(uint64_t, pause_at, 0,
          "checkpoint at this position of the first epoch, print it and wait (0: never)");
ABSL_FLAG(bool, pause_at_shard_end, false, "print each end of shard and wait");

namespace samplerd {
namespace {

int Fail(const char* what, const absl::Status& s) {
  std::printf("error %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// Waits for the test's go-ahead: a line on stdin.
absl::Status AwaitGoAhead() {
  std::fflush(stdout);
  char line[64];
  if (std::fgets(line, sizeof line, stdin) == nullptr) {
    return absl::AbortedError("stdin closed before the go-ahead");
  }
  return absl::OkStatus();
}

int Main() {
  auto client = testutil::RankClient();
  if (!client.ok()) return Fail("SamplerClient::Create", client.status());
  EpochLoopOptions options;
  options.batch_size = absl::GetFlag(FLAGS_batch);
  options.queue_capacity = 4 * options.batch_size;  // Streams reopened along the shard.
  auto loop = EpochLoop::Create(std::shared_ptr<SamplerClient>(*std::move(client)),
                                absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_rank),
                                absl::GetFlag(FLAGS_world_size), options);
  if (!loop.ok()) return Fail("EpochLoop::Create", loop.status());
  EpochLoop& l = **loop;
  const uint64_t pause_at = absl::GetFlag(FLAGS_pause_at);
  bool paused = false;
  std::vector<float> losses;
  const auto step = [&](const EpochBatch& batch, LossSink& sink) -> absl::Status {
    if (pause_at > 0 && !paused && batch.position == pause_at) {
      paused = true;
      absl::StatusOr<ReaderPosition> at = l.Checkpoint();
      if (!at.ok()) return at.status();
      std::printf("checkpoint epoch=%lu position=%lu\n", static_cast<unsigned long>(at->epoch),
                  static_cast<unsigned long>(at->position));
      if (absl::Status s = AwaitGoAhead(); !s.ok()) return s;
    }
    losses.clear();
    for (uint64_t index : batch.indices) losses.push_back((index % 100) * 0.01f);
    return sink.Report(losses);
  };
  const auto shard_end = [&](const ShardEnd& end) -> absl::Status {
    if (!absl::GetFlag(FLAGS_pause_at_shard_end)) return absl::OkStatus();
    std::printf("shard_end epoch=%lu accepted=%lu duplicates=%lu\n",
                static_cast<unsigned long>(end.epoch),
                static_cast<unsigned long>(end.losses.accepted),
                static_cast<unsigned long>(end.losses.duplicates));
    return AwaitGoAhead();
  };
  if (absl::Status s = l.Run(/*first_epoch=*/0, absl::GetFlag(FLAGS_epochs), step, shard_end);
      !s.ok()) {
    return Fail("Run", s);
  }
  std::printf("done\n");
  return 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return samplerd::Main();
}
