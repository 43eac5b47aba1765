// RunWithCheckpoints (examples/cpp/checkpointed_loop.h) against a real in-process samplerd over
// real gRPC (loopback, port 0): where it saves (the start of every every_steps-th step of a shard,
// and each end of shard), that a rank stopped mid-epoch and started again from its file resumes
// the saved position with the saved model and ends exactly as an uninterrupted run, that a
// checkpoint past the last epoch trains nothing, and that without a path nothing is saved.
#include "examples/cpp/checkpointed_loop.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/loop_server_test_base.h"

namespace samplerd {
namespace examples {
namespace {

using ::testing::ElementsAre;

// 6000 samples, one rank, batches of 512: 12 steps a shard, the last of 368.
constexpr uint64_t kBatch = 512;

// A model that is the number of positions it trained, so that a restored model replaying the
// batches after its checkpoint ends exactly where an uninterrupted one does.
struct CountingModel {
  uint64_t trained = 0;
  std::string Serialize() const { return absl::StrCat(trained); }
  bool Restore(const std::string& bytes) { return absl::SimpleAtoi(bytes, &trained); }
};

class CheckpointedLoopTest : public LoopServerTest {
 protected:
  void SetUp() override {
    LoopServerTest::SetUp();
    dir_ = absl::StrCat(::testing::TempDir(), "/checkpointed_loop_test");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    LoopServerTest::TearDown();
  }

  // One process of rank 0 of `job`: loads its checkpoint (if options.path has one), runs to
  // `epochs`, stops with ABORTED at the step of position `die_at` of epoch `die_epoch` (if set).
  // Returns what it did.
  struct Process {
    absl::Status result;
    std::optional<ReaderPosition> resumed;
    std::vector<std::pair<uint64_t, uint64_t>> saved;  // (epoch, position) of each save.
    std::vector<std::pair<uint64_t, uint64_t>> steps;  // (epoch, position) of each step.
    CountingModel model;
  };
  Process RunProcess(const std::string& job, const CheckpointOptions& options, uint64_t epochs,
                     std::optional<std::pair<uint64_t, uint64_t>> die_at = std::nullopt) {
    Process p;
    EpochLoopOptions loop_options;
    loop_options.batch_size = kBatch;
    std::unique_ptr<EpochLoop> loop = NewLoop(job, 0, 1, loop_options);
    if (loop == nullptr) return p;
    absl::StatusOr<std::optional<TrainerCheckpoint>> saved = LoadCheckpointIfAny(options);
    if (!saved.ok()) {
      p.result = saved.status();
      return p;
    }
    if (saved->has_value()) EXPECT_TRUE(p.model.Restore((*saved)->model));
    p.resumed = ResumeFrom(*saved);
    p.result = RunWithCheckpoints(
        *loop, options, p.resumed, /*current_epoch=*/0, epochs,
        [&]() -> absl::StatusOr<std::string> { return p.model.Serialize(); },
        [&](const EpochBatch& batch, LossSink& losses) -> absl::Status {
          if (die_at == std::make_pair(batch.epoch, batch.position)) {
            return absl::AbortedError("injected: the process dies");
          }
          p.steps.emplace_back(batch.epoch, batch.position);
          p.model.trained += batch.indices.size();
          return losses.Report(std::vector<float>(batch.indices.size(), 0.5f));
        },
        nullptr, [&](const ReaderPosition& at) { p.saved.emplace_back(at.epoch, at.position); });
    return p;
  }

  std::string dir_;
};

TEST_F(CheckpointedLoopTest, SavesAtEveryNthStepAndShardEndsAndResumesExactly) {
  CreateJob("ref", 1);
  const Process reference = RunProcess("ref", {}, 2);
  ASSERT_TRUE(reference.result.ok()) << reference.result;
  EXPECT_EQ(reference.model.trained, 2 * kSamples);
  EXPECT_TRUE(reference.saved.empty());  // No path: nothing saved.

  CreateJob("killed", 1);
  const CheckpointOptions options{dir_ + "/killed.ckpt", 4};
  // Dies at the step of position 4608 (the 10th of epoch 1), after the save at 4096.
  const Process first = RunProcess("killed", options, 2, std::make_pair(1, 4608));
  EXPECT_EQ(first.result.code(), absl::StatusCode::kAborted) << first.result;
  EXPECT_FALSE(first.resumed.has_value());
  EXPECT_THAT(first.saved, ElementsAre(std::make_pair(0, 2048), std::make_pair(0, 4096),
                                       std::make_pair(0, kSamples), std::make_pair(1, 2048),
                                       std::make_pair(1, 4096)));

  const Process second = RunProcess("killed", options, 2);
  ASSERT_TRUE(second.result.ok()) << second.result;
  ASSERT_TRUE(second.resumed.has_value());
  EXPECT_EQ(second.resumed->epoch, 1u);
  EXPECT_EQ(second.resumed->position, 4096u);
  // The steps from the checkpoint on (the one at 4096 again, trained before by the first
  // process), then the end of the shard.
  ASSERT_FALSE(second.steps.empty());
  EXPECT_EQ(second.steps.front(), (std::pair<uint64_t, uint64_t>(1, 4096)));
  EXPECT_EQ(second.steps.size(), 4u);  // 4096, 4608, 5120, 5632.
  EXPECT_THAT(second.saved, ElementsAre(std::make_pair(1, kSamples)));
  EXPECT_EQ(second.model.trained, reference.model.trained);  // The restored model, replayed.

  // Its checkpoint is now past the last epoch: a third start trains nothing.
  const Process third = RunProcess("killed", options, 2);
  ASSERT_TRUE(third.result.ok()) << third.result;
  EXPECT_TRUE(third.steps.empty());
  EXPECT_EQ(third.model.trained, 2 * kSamples);
  v1::JobStatus status = *client_->GetJobStatus("killed");
  EXPECT_EQ(status.job().current_epoch(), 2u);
  EXPECT_EQ(status.samples_seen(), kSamples);
}

TEST_F(CheckpointedLoopTest, ADamagedCheckpointIsDataLossNamingThePath) {
  CreateJob("damaged", 1);
  const std::string path = dir_ + "/damaged.ckpt";
  { std::ofstream(path) << "not a checkpoint\n"; }
  const Process p = RunProcess("damaged", {path, 4}, 1);
  EXPECT_EQ(p.result.code(), absl::StatusCode::kDataLoss) << p.result;
  EXPECT_THAT(p.result.message(), ::testing::HasSubstr(path));
  EXPECT_TRUE(p.steps.empty());
}

}  // namespace
}  // namespace examples
}  // namespace samplerd
