// The C++ example trainer (examples/cpp/cpu_trainer: EpochLoop on the CPU-only library, a toy
// model, checkpoint files) as real rank processes against the real samplerd binary on a
// --data_dir: a rank SIGKILLed in the middle of an epoch after a checkpoint and started again
// resumes from its file, as the Python trainers are tested (tests/python/test_ddp_restart.py).
// What EpochLoop documents (client/cpp/epoch_loop.h, "Checkpoints") is checked from both sides:
//   * the trainers' own record ("trained" lines): every position of every epoch's shard trained
//     once, but the positions after the killed rank's last checkpoint that the killed process
//     had already trained, which are trained again (and only those);
//   * the server's: each rank's losses_accepted of each epoch equals its shard length (the
//     replayed losses count once), the job reaches the end of its epochs, and it saw the same
//     samples as an uninterrupted run of the same spec;
//   * the model: the restored model trained on the replayed batches ends bit-identical to the
//     uninterrupted run's (the same batches in the same order, the same losses, the same plans).
// Without the resume (a restarted rank that runs its epoch from the start, or that does not
// restore its model) the first or the last check fails. A restart without its checkpoint file
// says what it trains again (EpochLoop::restart_summary, printed by the trainer).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/child_process.h"
#include "tests/samplerd_process.h"

namespace samplerd {
namespace {

using testutil::ChildProcess;
using testutil::SamplerdProcess;

constexpr char kSamplerd[] = "server/samplerd";
constexpr char kTrainer[] = "examples/cpp/cpu_trainer";
constexpr uint32_t kWorld = 2;
constexpr uint64_t kSamples = 2000;  // A shard of 1000 per rank.
constexpr uint64_t kShard = kSamples / kWorld;
constexpr uint64_t kEpochs = 3;
constexpr uint64_t kBatch = 50;  // 20 steps per shard; a checkpoint every 4 (200 positions).

// The value of `key=` in `line` ("trained epoch=1 position=400 n=50"), or -1.
int64_t Field(const std::string& line, const std::string& key) {
  for (absl::string_view word : absl::StrSplit(line, ' ')) {
    int64_t value = 0;
    if (absl::ConsumePrefix(&word, key + "=") && absl::SimpleAtoi(word, &value)) return value;
  }
  return -1;
}

std::vector<std::string> Lines(const std::string& output, const std::string& prefix) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, prefix)) lines.emplace_back(line);
  }
  return lines;
}

// How often each (epoch, position) was trained, from "trained" lines.
using TrainCounts = std::map<std::pair<int64_t, int64_t>, int>;
void CountTrained(const std::string& output, TrainCounts& counts) {
  for (const std::string& line : Lines(output, "trained ")) {
    const int64_t epoch = Field(line, "epoch"), position = Field(line, "position");
    for (int64_t p = position; p < position + Field(line, "n"); ++p) ++counts[{epoch, p}];
  }
}

class CpuTrainerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/cpu_trainer_process_test");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/data");
    samplerd_ = std::make_unique<SamplerdProcess>(kSamplerd, 0,
                                                  std::vector<std::string>{"--data_dir=" + dir_ +
                                                                           "/data"});
    ASSERT_FALSE(samplerd_->address().empty()) << "no 'samplerd listening on' line";
    client_ = *SamplerClient::Create(samplerd_->address());
  }
  void TearDown() override {
    samplerd_.reset();
    std::filesystem::remove_all(dir_);
  }

  // One rank of `job`; with a checkpoint file in dir_ if `checkpoints`.
  std::unique_ptr<ChildProcess> StartRank(const std::string& job, uint32_t rank, bool checkpoints,
                                          int step_ms, const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {kTrainer,
                                     "--address=" + samplerd_->address(),
                                     "--job=" + job,
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--world_size=", kWorld),
                                     absl::StrCat("--num_samples=", kSamples),
                                     absl::StrCat("--epochs=", kEpochs),
                                     absl::StrCat("--batch=", kBatch),
                                     "--checkpoint_every=4",
                                     absl::StrCat("--step_ms=", step_ms)};
    if (checkpoints) {
      args.push_back(absl::StrCat("--checkpoint_file=", dir_, "/", job, ".rank-", rank, ".ckpt"));
    }
    args.insert(args.end(), more.begin(), more.end());
    return std::make_unique<ChildProcess>(args);
  }

  // Runs `job` to its end without interruption; returns each rank's output.
  std::vector<std::string> RunUninterrupted(const std::string& job) {
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (uint32_t r = 0; r < kWorld; ++r) ranks.push_back(StartRank(job, r, false, 0));
    std::vector<std::string> outputs;
    for (uint32_t r = 0; r < kWorld; ++r) {
      EXPECT_EQ(ranks[r]->Wait(), 0) << job << " rank " << r << ": " << ranks[r]->output();
      outputs.push_back(ranks[r]->output());
    }
    return outputs;
  }

  std::string dir_;
  std::unique_ptr<SamplerdProcess> samplerd_;
  std::unique_ptr<SamplerClient> client_;
};

TEST_F(CpuTrainerProcessTest, RankSigkilledMidEpochResumesFromItsCheckpoint) {
  // Steps of 20 ms, so that the kill lands in the middle of epoch 1's shard (from the awaited
  // line to the end of the shard: 9 steps, 180 ms).
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) ranks.push_back(StartRank("killed", r, true, 20));
  // Rank 1 saved at position 400 of epoch 1, then trained at least positions 400..499.
  ASSERT_FALSE(ranks[1]->AwaitLine("checkpoint epoch=1 position=400").empty())
      << ranks[1]->output();
  ASSERT_FALSE(ranks[1]->AwaitLine("trained epoch=1 position=450").empty())
      << ranks[1]->output();
  ASSERT_EQ(ranks[1]->Signal(SIGKILL), 128 + SIGKILL);
  const std::string killed_output = ranks[1]->output();
  const std::vector<std::string> saved = Lines(killed_output, "checkpoint epoch=1 ");
  ASSERT_FALSE(saved.empty());
  const int64_t last_printed = Field(saved.back(), "position");
  int64_t killed_reached = 0;  // One past the last position the killed process trained.
  for (const std::string& line : Lines(killed_output, "trained epoch=1 ")) {
    killed_reached = std::max(killed_reached, Field(line, "position") + Field(line, "n"));
  }
  ASSERT_LT(killed_reached, static_cast<int64_t>(kShard)) << "the kill was not mid-epoch";
  ASSERT_GT(killed_reached, last_printed) << "nothing trained after the checkpoint";

  ranks[1] = StartRank("killed", 1, true, 20);
  std::vector<std::string> outputs(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ": " << ranks[r]->output();
    outputs[r] = ranks[r]->output();
  }
  // The last checkpoint on disk: the last one printed, or a later one the kill fell between
  // the rename and the print of.
  ASSERT_TRUE(absl::StartsWith(outputs[1], "resumed epoch=1 position=")) << outputs[1];
  const int64_t resume_at = Field(outputs[1].substr(0, outputs[1].find('\n')), "position");
  ASSERT_GE(resume_at, last_printed);
  ASSERT_LT(resume_at, killed_reached);
  EXPECT_EQ(resume_at % (4 * kBatch), 0) << "not a checkpoint of --checkpoint_every=4";

  // The trainers' record: each position once, but the replay [resume_at, killed_reached) of the
  // killed rank's epoch 1, twice.
  for (uint32_t r = 0; r < kWorld; ++r) {
    TrainCounts counts;
    CountTrained(outputs[r], counts);
    if (r == 1) CountTrained(killed_output, counts);
    for (int64_t e = 0; e < static_cast<int64_t>(kEpochs); ++e) {
      for (int64_t p = 0; p < static_cast<int64_t>(kShard); ++p) {
        const bool replayed = r == 1 && e == 1 && p >= resume_at && p < killed_reached;
        ASSERT_EQ((counts[{e, p}]), replayed ? 2 : 1)
            << "rank " << r << " epoch " << e << " position " << p << " (resumed at "
            << resume_at << ", the killed process reached " << killed_reached << ")";
      }
    }
    EXPECT_EQ(counts.size(), kEpochs * kShard) << "rank " << r << " trained other positions";
  }

  // The server's record: every epoch's losses of each rank accepted once each.
  for (uint32_t r = 0; r < kWorld; ++r) {
    std::string all = outputs[r];
    if (r == 1) all = killed_output + all;
    std::map<int64_t, int64_t> accepted;
    for (const std::string& line : Lines(all, "shard_end ")) {
      EXPECT_EQ(Field(line, "shard_length"), static_cast<int64_t>(kShard)) << line;
      accepted[Field(line, "epoch")] = Field(line, "losses_accepted");
    }
    for (int64_t e = 0; e < static_cast<int64_t>(kEpochs); ++e) {
      EXPECT_EQ(accepted[e], static_cast<int64_t>(kShard)) << "rank " << r << " epoch " << e;
    }
  }

  // The same spec run without a kill: the same plans, so the same samples and the same model.
  const std::vector<std::string> reference = RunUninterrupted("reference");
  absl::StatusOr<v1::JobStatus> killed = client_->GetJobStatus("killed");
  absl::StatusOr<v1::JobStatus> uninterrupted = client_->GetJobStatus("reference");
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  EXPECT_EQ(killed->job().current_epoch(), kEpochs);
  EXPECT_EQ(killed->samples_seen(), uninterrupted->samples_seen());
  EXPECT_GT(killed->samples_seen(), 0u);
  for (uint32_t r = 0; r < kWorld; ++r) {
    const std::vector<std::string> done = Lines(outputs[r], "done model ");
    const std::vector<std::string> expected = Lines(reference[r], "done model ");
    ASSERT_EQ(done.size(), 1u) << outputs[r];
    ASSERT_EQ(expected.size(), 1u) << reference[r];
    EXPECT_EQ(done[0], expected[0]) << "rank " << r;
  }
}

// A rank SIGKILLed in the middle of epoch 0 and started again without a checkpoint file: it runs
// epoch 0 from position 0, so the positions the killed process trained are trained again. Before
// EpochLoop::Run checked for it, nothing said so; now the trainer's restart_summary line counts
// exactly the losses the server had accepted of the killed process (and stderr has the warning),
// and with --restart_warnings_are_errors the restart is refused before it trains anything.
TEST_F(CpuTrainerProcessTest, RankRestartedWithoutItsCheckpointCountsWhatItTrainsAgain) {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) ranks.push_back(StartRank("again", r, false, 20));
  ASSERT_FALSE(ranks[1]->AwaitLine("trained epoch=0 position=450").empty()) << ranks[1]->output();
  ASSERT_EQ(ranks[1]->Signal(SIGKILL), 128 + SIGKILL);
  const std::string killed_output = ranks[1]->output();
  int64_t killed_reached = 0;
  for (const std::string& line : Lines(killed_output, "trained epoch=0 ")) {
    killed_reached = std::max(killed_reached, Field(line, "position") + Field(line, "n"));
  }
  ASSERT_LT(killed_reached, static_cast<int64_t>(kShard)) << "the kill was not mid-epoch";
  // Epoch 0 stays open (rank 1 has not ended it).
  absl::StatusOr<v1::JobStatus> before = client_->GetJobStatus("again");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->job().current_epoch(), 0u);

  // Refused: exit 1 before training or streaming anything.
  std::unique_ptr<ChildProcess> strict =
      StartRank("again", 1, false, 20, {"--restart_warnings_are_errors"});
  EXPECT_EQ(strict->Wait(), 1) << strict->output();
  EXPECT_THAT(Lines(strict->output(), "trained "), ::testing::IsEmpty()) << strict->output();
  // What the server holds of rank 1 now is fixed: the refused process claimed the rank, so the
  // killed one's connection (and any call of it still in flight at the kill) was over.
  absl::StatusOr<v1::JobStatus> after = client_->GetJobStatus("again");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->ranks(1).indices_streamed(), before->ranks(1).indices_streamed());
  const uint64_t accepted = after->ranks(1).losses_accepted();
  EXPECT_GE(accepted, before->ranks(1).losses_accepted());
  ASSERT_GT(accepted, 0u);

  // Warned and counted: the restart trains epoch 0 from position 0 and says how many again.
  ranks[1] = StartRank("again", 1, false, 20);
  std::vector<std::string> outputs(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ": " << ranks[r]->output();
    outputs[r] = ranks[r]->output();
  }
  EXPECT_THAT(Lines(outputs[1], "restart_summary "),
              ::testing::ElementsAre(absl::StrCat("restart_summary served_again=", accepted)));
  EXPECT_THAT(Lines(outputs[0], "restart_summary "),
              ::testing::ElementsAre("restart_summary served_again=0"));
  TrainCounts counts;
  CountTrained(killed_output, counts);
  CountTrained(outputs[1], counts);
  for (int64_t p = 0; p < static_cast<int64_t>(kShard); ++p) {
    ASSERT_EQ((counts[{0, p}]), p < killed_reached ? 2 : 1) << "epoch 0 position " << p;
  }
}

}  // namespace
}  // namespace samplerd
