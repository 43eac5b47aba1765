#include "server/epoch_history.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job_config.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Opening = EpochHistory::Opening;

constexpr uint64_t kN = 16;

JobConfig Config(uint32_t rewind_epochs) {
  v1::JobSpec spec;
  spec.set_num_samples(kN);
  spec.set_world_size(2);
  spec.set_seed(1);
  spec.mutable_policy()->set_loss(v1::LOSS);
  JobLimits limits;
  limits.rewind_epochs = rewind_epochs;
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

class EpochHistoryTest : public ::testing::Test {
 protected:
  // Epoch `epoch` opened (by `by`) with weights all `weight`, and losses of `epoch` applied
  // to the first `seen` samples before it opened.
  void Open(EpochHistory& history, Opening::By by, uint64_t epoch, float weight, uint64_t seen) {
    PlannedEpoch planned;
    planned.epoch = epoch;
    planned.view.weights = *backend_->MakeWeights(std::vector<float>(kN, weight));
    std::vector<uint64_t> indices;
    for (uint64_t i = 0; i < seen; ++i) indices.push_back(i);
    ASSERT_TRUE(losses_->Apply(epoch, indices, std::vector<float>(seen, 1.0f)).ok());
    Opening opening;
    opening.by = by;
    opening.planned = &planned;
    opening.world_size = 2;
    opening.losses = losses_.get();
    ASSERT_TRUE(history.BeforePublishing(opening).ok());
    ASSERT_TRUE(history.AfterPublishing(opening).ok());
  }

  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(1);
  std::unique_ptr<BackendLossStats> losses_ = *backend_->NewLossStats(kN, 0.5);
};

TEST_F(EpochHistoryTest, InMemoryKeepsTheNewestStartsWithTheirStatistics) {
  std::unique_ptr<EpochHistory> history = MakeInMemoryHistory("j", Config(2));
  EXPECT_THAT(history->KeptEpochs(), IsEmpty());
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  Open(*history, Opening::By::kEndEpoch, 1, 2.0f, 3);
  Open(*history, Opening::By::kEndEpoch, 2, 3.0f, 5);
  EXPECT_THAT(history->KeptEpochs(), ElementsAre(1, 2));
  absl::StatusOr<EpochHistory::EpochStart> start = history->Read(1);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(start->world_size, 2u);
  EXPECT_EQ((*start->weights)[0], 2.0f);
  ASSERT_EQ(start->loss_stats.size(), kN);
  EXPECT_EQ(start->loss_stats[2].count, 1u);  // Applied before epoch 1 opened.
  EXPECT_EQ(start->loss_stats[3].count, 0u);
  const absl::Status gone = history->Read(0).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gone.message()), HasSubstr("epoch = 0 of job 'j'"));
  // A rewind forgets what came after; the start itself stays for another rewind.
  ASSERT_TRUE(history->Rewind(1).ok());
  EXPECT_THAT(history->KeptEpochs(), ElementsAre(1));
  EXPECT_TRUE(history->Read(1).ok());
  // Nothing is recorded in memory, and there is nothing to sync.
  EXPECT_FALSE(history->PrepareLosses(LossBatchView{}).has_value());
  EXPECT_TRUE(history->LogRankEnded(1, 0, 0).ok());
  EXPECT_TRUE(history->Sync().ok());
}

TEST_F(EpochHistoryTest, InMemoryWithoutRewindsKeepsNothing) {
  std::unique_ptr<EpochHistory> history = MakeInMemoryHistory("j", Config(0));
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  EXPECT_THAT(history->KeptEpochs(), IsEmpty());
}

TEST_F(EpochHistoryTest, AReUploadReplacesTheStartOfEpochZero) {
  std::unique_ptr<EpochHistory> history = MakeInMemoryHistory("j", Config(3));
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  Open(*history, Opening::By::kUpload, 0, 4.0f, 0);
  EXPECT_THAT(history->KeptEpochs(), ElementsAre(0));
  EXPECT_EQ((*history->Read(0)->weights)[0], 4.0f);
}

TEST_F(EpochHistoryTest, AJournalKeepsItsStartsAsSnapshots) {
  testutil::TestDir dir;
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Create(dir.path() + "/j");
  ASSERT_TRUE(journal.ok()) << journal.status();
  std::unique_ptr<EpochHistory> history = MakeJournalHistory("j", Config(3), *std::move(journal));
  // Created awaiting its upload: a snapshot, but not a start to rewind to.
  ASSERT_TRUE(history->AwaitUpload().ok());
  EXPECT_THAT(history->KeptEpochs(), ElementsAre(0));
  EXPECT_THAT(std::string(history->Read(0).status().message()), HasSubstr("was never planned"));
  // The upload's snapshot is durable before the plan is published.
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  absl::StatusOr<EpochHistory::EpochStart> start = history->Read(0);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_TRUE(start->planned);
  EXPECT_EQ(start->job, "j");
  // A loss batch is recorded in the epoch's log.
  const std::vector<uint64_t> indices = {1};
  const std::vector<float> losses = {0.5f};
  const std::vector<uint64_t> positions = {0};
  const LossBatchView batch{0, 0, 0, indices, losses, positions};
  const EpochHistory::LossRecord record = history->PrepareLosses(batch);
  ASSERT_TRUE(record.has_value());
  EXPECT_TRUE(history->LogLosses(record).ok());
  EXPECT_TRUE(history->Sync().ok());
  // A start that is not kept: nothing changes.
  const absl::Status missing = history->Rewind(5);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition) << missing;
  EXPECT_THAT(std::string(missing.message()), HasSubstr("its start is no longer kept"));
  EXPECT_TRUE(history->Rewind(0).ok());
  EXPECT_TRUE(history->Remove().ok());
}

TEST_F(EpochHistoryTest, AJournalKeepsTheCurrentEpochFromTheMomentItIsServed) {
  // Issue 24, defect 5: the snapshot of an epoch opened by EndEpoch is written in the
  // background, yet the epoch is rewindable as soon as it is served.
  testutil::TestDir dir;
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Create(dir.path() + "/j");
  ASSERT_TRUE(journal.ok()) << journal.status();
  std::unique_ptr<EpochHistory> history = MakeJournalHistory("j", Config(2), *std::move(journal));
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    Open(*history, Opening::By::kEndEpoch, epoch, 1.0f + epoch, 4);
    EXPECT_THAT(history->KeptEpochs(), ElementsAre(epoch - 1, epoch));
    absl::StatusOr<EpochHistory::EpochStart> start = history->Read(epoch);
    ASSERT_TRUE(start.ok()) << start.status();
    EXPECT_EQ((*start->weights)[0], 1.0f + epoch);
  }
}

TEST_F(EpochHistoryTest, AJournalWithoutRewindsListsNoStart) {
  testutil::TestDir dir;
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Create(dir.path() + "/j");
  ASSERT_TRUE(journal.ok()) << journal.status();
  std::unique_ptr<EpochHistory> history = MakeJournalHistory("j", Config(0), *std::move(journal));
  Open(*history, Opening::By::kUpload, 0, 1.0f, 0);
  EXPECT_THAT(history->KeptEpochs(), IsEmpty());  // Its one snapshot is for recovery only.
}

}  // namespace
}  // namespace samplerd
