// Elastic world size (Job::Resize, proto ResizeJob): a group that changes size between epochs
// or loses a rank in the middle of one. In memory and with a journal (restored after the
// resize).
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "server/job.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::BatchOfRange;

float LossOf(uint64_t index) { return static_cast<float>(index % 7) / 2; }

class JobResizeTest : public ::testing::TestWithParam<bool> {
 protected:
  bool persisted() const { return GetParam(); }

  // N samples, `world` ranks, INTERLEAVED + PAD, a LOSS policy; M = `m` (0: N).
  JobConfig Config(uint64_t n, uint32_t world, uint64_t m) const {
    v1::JobSpec spec;
    spec.set_num_samples(n);
    spec.set_world_size(world);
    spec.set_samples_per_epoch(m);
    spec.set_seed(17);
    spec.mutable_policy()->set_loss(v1::LOSS);
    auto config = MakeJobConfig(spec, JobLimits());
    EXPECT_TRUE(config.ok()) << config.status();
    config->rewind_epochs = 3;
    return *config;
  }

  std::unique_ptr<Job> Create(const std::string& name, uint64_t n, uint32_t world, uint64_t m) {
    std::unique_ptr<JobJournal> journal;
    if (persisted()) {
      auto created = JobJournal::Create(absl::StrCat(dir_.path(), "/", name));
      EXPECT_TRUE(created.ok()) << created.status();
      journal = *std::move(created);
    }
    auto job = Job::Create(name, Config(n, world, m), backend_.get(), std::move(journal));
    EXPECT_TRUE(job.ok()) << job.status();
    return *std::move(job);
  }

  // The job rebuilt from its journal (persisted runs only): as a server restart does.
  std::unique_ptr<Job> Restart(std::unique_ptr<Job> job) {
    const JobConfig config = job->config();
    const std::string name = job->name();
    job->Close(absl::UnavailableError("restart"));
    job.reset();  // Closes again: already closed, nothing removed.
    auto recovered = JobJournal::Recover(absl::StrCat(dir_.path(), "/", name));
    EXPECT_TRUE(recovered.ok()) << recovered.status();
    auto restored = Job::Restore(name, config, backend_.get(), *std::move(recovered));
    EXPECT_TRUE(restored.ok()) << restored.status();
    return *std::move(restored);
  }

  std::vector<uint64_t> Shard(Job& job, uint64_t epoch, uint32_t rank) {
    return testutil::ShardOf(job, *backend_, epoch, rank);
  }

  // Reports positions [from, to) of `rank`'s shard in the current deal; returns accepted.
  uint64_t Report(Job& job, uint64_t epoch, uint32_t rank, uint64_t from, uint64_t to) {
    const v1::Job d = job.Describe();
    auto batch = BatchOfRange(epoch, rank, 0, Shard(job, epoch, rank), from, to, LossOf);
    batch.deal = d.deal();
    v1::LossReportSummary summary;
    const absl::Status s = job.ReportLosses(batch.view(), &summary);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(job.Sync().ok());
    return summary.accepted();
  }

  // Every rank of the current deal reports its whole shard and ends the epoch.
  void RunEpoch(Job& job, uint64_t epoch) {
    const v1::Job d = job.Describe();
    for (uint32_t r = 0; r < d.world_size(); ++r) {
      Report(job, epoch, r, 0, Shard(job, epoch, r).size());
    }
    for (uint32_t r = 0; r < d.world_size(); ++r) {
      auto ended = job.EndEpoch(epoch, d.deal(), r);
      ASSERT_TRUE(ended.ok()) << ended.status();
    }
  }

  // The epoch's plan (M positions) read back from the shards of its deal 0: INTERLEAVED puts
  // plan position q at position q / R of rank q % R.
  std::vector<uint64_t> PlanOf(Job& job, uint64_t epoch) {
    const uint32_t world = job.Describe().world_size();
    std::vector<std::vector<uint64_t>> shards;
    for (uint32_t r = 0; r < world; ++r) shards.push_back(Shard(job, epoch, r));
    std::vector<uint64_t> plan(job.config().plan.samples_per_epoch);
    for (uint64_t q = 0; q < plan.size(); ++q) plan[q] = shards[q % world][q / world];
    return plan;
  }

  testutil::TestDir dir_;
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
};

INSTANTIATE_TEST_SUITE_P(InMemoryAndOnDisk, JobResizeTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "OnDisk" : "InMemory"; });

// 4 ranks for epoch 0, 2 from epoch 1, 3 from epoch 2: the plans equal those of a job that
// kept 4 ranks (the plan does not depend on R), and the new shards deal each plan equally.
TEST_P(JobResizeTest, BetweenEpochsThePlansStayTheSame) {
  constexpr uint64_t kN = 200, kM = 120;  // Weighted selection: plans depend on the losses.
  auto job = Create("elastic", kN, 4, kM);
  auto fixed = Create("fixed", kN, 4, kM);
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    const uint32_t world = epoch == 0 ? 4 : epoch == 1 ? 2 : 3;
    if (epoch > 0) {
      auto resized = job->Resize(epoch, world);
      ASSERT_TRUE(resized.ok()) << resized.status();
      EXPECT_EQ(resized->world_size(), world);
      EXPECT_EQ(resized->deal(), 1u);
      EXPECT_EQ(resized->spec().world_size(), 4u);  // The spec stays as created.
      if (persisted()) job = Restart(std::move(job));
    }
    const std::vector<uint64_t> plan = PlanOf(*job, epoch);
    EXPECT_EQ(plan, PlanOf(*fixed, epoch)) << "epoch " << epoch;
    std::multiset<uint64_t> dealt;
    for (uint32_t r = 0; r < world; ++r) {
      const std::vector<uint64_t> shard = Shard(*job, epoch, r);
      EXPECT_EQ(shard.size(), kM / world);
      auto length = job->DescribeForRank(r, std::nullopt);
      ASSERT_TRUE(length.ok());
      EXPECT_EQ(length->shard_length(), kM / world);
      dealt.insert(shard.begin(), shard.end());
    }
    EXPECT_EQ(dealt, std::multiset<uint64_t>(plan.begin(), plan.end()));
    RunEpoch(*job, epoch);
    RunEpoch(*fixed, epoch);
  }
  // The world size carries into the next epoch's deal 0.
  const v1::Job after = job->Describe();
  EXPECT_EQ(after.current_epoch(), 3u);
  EXPECT_EQ(after.world_size(), 3u);
  EXPECT_EQ(after.deal(), 0u);
  EXPECT_EQ(PlanOf(*job, 3), PlanOf(*fixed, 3));
}

// A rank is lost in the middle of an epoch and the group continues with 3: what was done
// stays, the rest is dealt to the 3 ranks, and every sample of the epoch is trained once (M = N
// without replacement: each index is one plan position).
TEST_P(JobResizeTest, MidEpochTheRestIsDealtToTheSurvivors) {
  constexpr uint64_t kN = 103;  // PAD: 4 shards of 26 (one padded position).
  auto job = Create("j", kN, 4, 0);
  std::set<uint64_t> trained;
  // Rank 2 ended the epoch (its whole shard consumed, losses of 20 positions reported); rank 3
  // did nothing.
  const uint64_t reported[4] = {10, 5, 20, 0};
  for (uint32_t r = 0; r < 4; ++r) {
    const std::vector<uint64_t> shard = Shard(*job, 0, r);
    if (reported[r] > 0) Report(*job, 0, r, 0, reported[r]);
    trained.insert(shard.begin(), shard.begin() + (r == 2 ? shard.size() : reported[r]));
  }
  ASSERT_TRUE(job->EndEpoch(0, 0, 2).ok());
  const std::vector<uint64_t> lost_rank0 = Shard(*job, 0, 0);

  auto resized = job->Resize(0, 3);
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(resized->deal(), 1u);
  if (persisted()) job = Restart(std::move(job));
  const v1::Job d = job->Describe();
  EXPECT_EQ(d.world_size(), 3u);
  EXPECT_EQ(d.deal(), 1u);
  EXPECT_EQ(d.current_epoch(), 0u);

  // 103 - 41 done = 62 left: PAD deals 3 shards of 21 (one padded).
  std::vector<std::vector<uint64_t>> shards;
  std::set<uint64_t> dealt;
  for (uint32_t r = 0; r < 3; ++r) {
    shards.push_back(Shard(*job, 0, r));
    EXPECT_EQ(shards[r].size(), 21u);
    dealt.insert(shards[r].begin(), shards[r].end());
  }
  EXPECT_EQ(dealt.size(), kN - trained.size());
  for (uint64_t i : dealt) EXPECT_EQ(trained.count(i), 0u) << "index " << i << " dealt again";
  std::set<uint64_t> all = trained;
  all.insert(dealt.begin(), dealt.end());
  EXPECT_EQ(all.size(), kN);

  // The old deal is gone for stragglers of the old group.
  auto stale = BatchOfRange(0, 0, 9, lost_rank0, 10, 12, LossOf);
  v1::LossReportSummary summary;
  absl::Status s = job->ReportLosses(stale.view(), &summary);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("deal = 0 of epoch 0 of job 'j' was replaced by deal 1"));
  EXPECT_EQ(job->EndEpoch(0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(testutil::AwaitShard(*job, 0, 0, 0, 4, absl::Now() + absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto wrong_world = testutil::AwaitShard(*job, 0, 1, 0, 4, absl::Now() + absl::Seconds(5));
  EXPECT_THAT(wrong_world.status().message(), HasSubstr("does not match the 3 ranks"));

  // A retried resize changes nothing.
  auto again = job->Resize(0, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->deal(), 1u);

  // The survivors train the rest: every loss is new (but the padded repeat), and the epoch
  // closes when the 3 ranks end it.
  uint64_t accepted = 0;
  for (uint32_t r = 0; r < 3; ++r) accepted += Report(*job, 0, r, 0, 21);
  EXPECT_EQ(accepted, kN - trained.size());
  for (uint32_t r = 0; r < 3; ++r) {
    auto ended = job->EndEpoch(0, 1, r);
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_EQ(ended->epoch_closed(), r == 2);
  }
  EXPECT_EQ(job->Status().samples_seen(), kN - 6);  // Rank 2 consumed 6 without a loss.
  EXPECT_EQ(Shard(*job, 1, 2).size(), 35u);         // Epoch 1: the whole plan to 3 ranks.
  EXPECT_EQ(job->Describe().deal(), 0u);
}

TEST_P(JobResizeTest, ResizedTwiceInOneEpoch) {
  constexpr uint64_t kN = 60;
  auto job = Create("j", kN, 4, 0);
  std::set<uint64_t> trained;
  for (uint32_t r = 0; r < 4; ++r) {
    const std::vector<uint64_t> shard = Shard(*job, 0, r);
    Report(*job, 0, r, 0, 3);
    trained.insert(shard.begin(), shard.begin() + 3);
  }
  ASSERT_TRUE(job->Resize(0, 2).ok());
  for (uint32_t r = 0; r < 2; ++r) {
    const std::vector<uint64_t> shard = Shard(*job, 0, r);
    Report(*job, 0, r, 0, 4);
    trained.insert(shard.begin(), shard.begin() + 4);
  }
  auto back = job->Resize(0, 4);  // Back to 4 ranks: deal 2, not deal 0.
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->deal(), 2u);
  if (persisted()) job = Restart(std::move(job));
  std::set<uint64_t> dealt;
  for (uint32_t r = 0; r < 4; ++r) {
    const std::vector<uint64_t> shard = Shard(*job, 0, r);
    EXPECT_EQ(shard.size(), 10u);  // 60 - 12 - 8 = 40 left.
    dealt.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(dealt.size(), 40u);
  for (uint64_t i : dealt) EXPECT_EQ(trained.count(i), 0u);
}

TEST_P(JobResizeTest, ARewindRestoresTheWorldSizeTheEpochStartedWith) {
  auto job = Create("j", 40, 4, 0);
  RunEpoch(*job, 0);
  ASSERT_TRUE(job->Resize(1, 2).ok());
  RunEpoch(*job, 1);
  EXPECT_EQ(job->Describe().world_size(), 2u);
  if (persisted()) job = Restart(std::move(job));
  const absl::Status rewound = job->Rewind(1);
  ASSERT_TRUE(rewound.ok()) << rewound;
  const v1::Job d = job->Describe();
  EXPECT_EQ(d.current_epoch(), 1u);
  EXPECT_EQ(d.world_size(), 4u);
  EXPECT_EQ(d.deal(), 0u);
  EXPECT_EQ(Shard(*job, 1, 3).size(), 10u);
}

TEST_P(JobResizeTest, BadResizesChangeNothing) {
  auto job = Create("j", 40, 4, 0);
  Report(*job, 0, 1, 0, 2);
  const std::string before = job->Status().DebugString();
  auto zero = job->Resize(0, 0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("world_size = 0 is outside [1, MAX_WORLD_SIZE"));
  auto huge = job->Resize(0, v1::MAX_WORLD_SIZE + 1);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  auto later = job->Resize(1, 2);
  EXPECT_EQ(later.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(later.status().message(),
              HasSubstr("epoch = 1 of job 'j' is not the current epoch 0"));
  EXPECT_EQ(job->Status().DebugString(), before);
  auto past = job->DescribeForRank(0, 0);
  EXPECT_TRUE(past.ok());
  EXPECT_EQ(job->DescribeForRank(4, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace samplerd
