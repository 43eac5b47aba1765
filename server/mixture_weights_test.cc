// Group weights that move (docs/SAMPLING.md, "Group weights"), through the real samplerd binary
// over gRPC: SetGroupWeights on a static mixture job, and the online rules (EXCESS_LOSS, EXP3)
// fed by the losses the ranks report. Each epoch's window counts are checked against the
// apportionment under the weights in force, the served weights against GroupWeights::Update
// applied by hand to the same per-group statistics (bit for bit), and the plans and weights
// against an uninterrupted in-memory run after a SIGKILL restart on --data_dir and a rewind.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_losses.h"
#include "kernels/mixture/group_weights.h"
#include "server/mixture_config.h"
#include "tests/samplerd_process.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using testutil::SamplerdProcess;

constexpr char kSamplerd[] = "server/samplerd";
constexpr uint32_t kWorld = 2;
constexpr uint64_t kWindow = 48;
const std::vector<uint64_t> kSizes = {30, 12, 50, 20};

v1::JobSpec Spec(v1::GroupWeightRule rule) {
  v1::JobSpec spec;
  spec.set_world_size(kWorld);
  spec.set_seed(7);
  spec.set_samples_per_epoch(kWindow);
  v1::MixtureSpec* m = spec.mutable_mixture();
  for (uint64_t n : kSizes) m->add_group_sizes(n);
  for (double w : {1.0, 1.0, 1.0, 1.0}) m->add_group_weights(w);
  m->set_rule(rule);
  if (rule == v1::EXCESS_LOSS) {
    for (double r : {1.0, 0.8, 0.8, 0.8}) m->add_reference_losses(r);
    m->mutable_online()->set_eta(2.0);
    m->mutable_online()->set_horizon(4);
  }
  if (rule == v1::EXP3) m->mutable_online()->set_eta(4.0);
  m->mutable_online()->set_min_ratio(0.1);
  return spec;
}

// The loss a rank reports for `index` in `epoch`: group 0 is unlearnable (a constant high loss,
// like random bytes), the others fall epoch by epoch at different rates.
float LossOf(const mixture::GroupLayout& layout, uint64_t index, uint64_t epoch) {
  const uint32_t k = layout.GroupOf(index);
  const double jitter = 0.01 * static_cast<double>(index % 7);
  if (k == 0) return static_cast<float>(5.0 + jitter);
  const double rate = 0.5 + 0.15 * k;
  return static_cast<float>(0.5 + 3.0 * std::pow(rate, static_cast<double>(epoch)) + jitter);
}

class MixtureWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/mixture_weights_test/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // samplerd on `port` (0: any), on dir_ if `persisted` (else in memory, keeping 3 starts).
  void Start(bool persisted, int port = 0) {
    std::vector<std::string> flags = {"--rewind_epochs=3"};
    if (persisted) flags.push_back("--data_dir=" + dir_);
    server_ = std::make_unique<SamplerdProcess>(kSamplerd, port, flags);
    ASSERT_FALSE(server_->address().empty()) << "no 'samplerd listening on' line";
    ClientOptions options;
    options.timeout = absl::Seconds(60);
    client_ = *SamplerClient::Create(server_->address(), options);
  }
  // A crash: SIGKILL, nothing of samplerd's shutdown runs; then a new one on the same directory.
  void KillAndRestart() {
    const int killed = server_->Signal(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL);
    Start(/*persisted=*/true);
  }

  void AwaitEpoch(const std::string& job, uint64_t epoch) {
    for (int i = 0; i < 1500; ++i) {
      absl::StatusOr<v1::Job> got = client_->GetJob(job);
      ASSERT_TRUE(got.ok()) << got.status();
      if (got->current_epoch() == epoch && got->plan_ready()) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "epoch " << epoch << " of " << job << " was not served";
  }

  // The plan of `epoch` (interleaved shards: position p is rank p mod R's position p / R).
  std::vector<uint64_t> ReadPlan(const std::string& job, uint64_t epoch) {
    std::vector<std::vector<uint64_t>> shards(kWorld);
    for (uint32_t r = 0; r < kWorld; ++r) {
      absl::StatusOr<std::vector<uint64_t>> shard = client_->ReadShard(job, epoch, r, kWorld);
      EXPECT_TRUE(shard.ok()) << shard.status();
      if (shard.ok()) shards[r] = *std::move(shard);
    }
    std::vector<uint64_t> plan(kWindow);
    for (uint64_t p = 0; p < kWindow; ++p) plan[p] = shards[p % kWorld].at(p / kWorld);
    return plan;
  }

  // Every rank reports the loss of its shard positions [from, to) of `epoch` (of `plan`).
  void Report(const std::string& job, uint64_t epoch, const std::vector<uint64_t>& plan,
              const mixture::GroupLayout& layout, uint64_t from, uint64_t to) {
    std::vector<v1::LossBatch> batches;
    for (uint32_t r = 0; r < kWorld; ++r) {
      v1::LossBatch b;
      b.set_job(job);
      b.set_epoch(epoch);
      b.set_rank(r);
      b.set_seq(from + 1);
      for (uint64_t pos = from; pos < to && pos * kWorld + r < kWindow; ++pos) {
        const uint64_t index = plan[pos * kWorld + r];
        b.add_positions(pos);
        b.add_indices(index);
        b.add_losses(LossOf(layout, index, epoch));
      }
      batches.push_back(std::move(b));
    }
    absl::StatusOr<v1::LossReportSummary> sent = client_->ReportLosses(batches);
    ASSERT_TRUE(sent.ok()) << sent.status();
  }

  void EndAll(const std::string& job, uint64_t epoch) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      absl::StatusOr<v1::EndEpochResponse> ended = client_->EndEpoch(job, epoch, r);
      ASSERT_TRUE(ended.ok()) << ended.status();
    }
  }

  // The weights the job shows for its current epoch, by group (K = 4: all are listed).
  std::vector<double> ServedWeights(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job);
    EXPECT_TRUE(status.ok()) << status.status();
    std::vector<double> w(kSizes.size(), -1);
    if (!status.ok()) return w;
    EXPECT_EQ(status->mixture().top_groups_size(), static_cast<int>(kSizes.size()));
    for (const v1::GroupStatus& g : status->mixture().top_groups()) w.at(g.group()) = g.weight();
    return w;
  }

  std::string dir_;
  std::unique_ptr<SamplerdProcess> server_;
  std::unique_ptr<SamplerClient> client_;
};

std::vector<uint64_t> CountsOf(const mixture::GroupLayout& layout,
                               const std::vector<uint64_t>& plan) {
  std::vector<uint64_t> counts(layout.groups(), 0);
  for (uint64_t i : plan) ++counts[layout.GroupOf(i)];
  return counts;
}

// The per-group statistics of `plan`'s losses in `epoch`, every position once: what the server
// aggregates from the ranks' reports.
mixture::GroupLosses StatsOf(const mixture::GroupLayout& layout, const std::vector<uint64_t>& plan,
                             uint64_t epoch) {
  mixture::GroupLosses stats(layout.groups());
  std::vector<float> losses;
  for (uint64_t i : plan) losses.push_back(LossOf(layout, i, epoch));
  EXPECT_TRUE(stats.Add(layout, plan, losses).ok());
  return stats;
}

// Bit for bit (EXPECT_EQ on doubles compares values; -0 and 0 aside, the same thing here).
void ExpectSameBits(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(std::memcmp(&got[k], &want[k], sizeof(double)), 0)
        << what << ": group " << k << " " << got[k] << " vs " << want[k];
  }
}

TEST_F(MixtureWeightsTest, SetGroupWeightsMovesTheNextWindowAndSurvivesACrash) {
  const v1::JobSpec spec = Spec(v1::STATIC_WEIGHTS);
  std::shared_ptr<const MixtureConfig> config = *MakeMixtureConfig(spec.mixture(), 0);
  const mixture::GroupLayout& layout = config->layout;
  const std::vector<double> set = {1.0, 6.0, 0.5, 2.5};
  // An uninterrupted in-memory run: the weights set during epoch 1 move epoch 2 on.
  std::vector<std::vector<uint64_t>> want;
  ASSERT_NO_FATAL_FAILURE(Start(/*persisted=*/false));
  ASSERT_TRUE(client_->CreateJob("s", spec).ok());
  for (uint64_t e = 0; e < 4; ++e) {
    AwaitEpoch("s", e);
    want.push_back(ReadPlan("s", e));
    if (e == 1) {
      absl::StatusOr<v1::Job> job = client_->SetGroupWeights("s", set);
      ASSERT_TRUE(job.ok()) << job.status();
      EXPECT_EQ(job->current_epoch(), 1u);  // In force from epoch 2.
    }
    EndAll("s", e);
  }
  // The windows: epochs 0-1 under the spec's shares, 2-3 under the new weights', the lags
  // carried across the change.
  mixture::Apportioner apportioner = *mixture::Apportioner::Create(4);
  const std::vector<uint64_t> new_shares = *mixture::SharesOf(*mixture::NormalizeWeights(set, 4));
  for (uint64_t e = 0; e < 4; ++e) {
    EXPECT_EQ(CountsOf(layout, want[e]),
              apportioner.Next(e < 2 ? config->shares : new_shares, kWindow)->counts)
        << "epoch " << e;
  }
  AwaitEpoch("s", 4);
  ExpectSameBits(ServedWeights("s"), *mixture::NormalizeWeights(set, 4), "served weights");

  // Bad input and refusals change nothing.
  absl::StatusOr<v1::Job> bad = client_->SetGroupWeights("s", {1.0, -2.0, 1.0, 1.0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("group_weights[1] = -2"));
  bad = client_->SetGroupWeights("s", {1.0, 1.0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("group_weights: 2 weights for 4"));
  bad = client_->SetGroupWeights("s", {0.0, 0.0, 0.0, 0.0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("group_weights"));
  v1::JobSpec plain;
  plain.set_num_samples(100);
  plain.set_world_size(1);
  ASSERT_TRUE(client_->CreateJob("plain", plain).ok());
  bad = client_->SetGroupWeights("plain", set);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not a mixture job"));
  ASSERT_TRUE(client_->CreateJob("online", Spec(v1::EXP3)).ok());
  bad = client_->SetGroupWeights("online", set);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("online"));
  EXPECT_EQ(client_->SetGroupWeights("nope", set).status().code(), absl::StatusCode::kNotFound);
  want.push_back(ReadPlan("s", 4));
  EXPECT_EQ(CountsOf(layout, want[4]), apportioner.Next(new_shares, kWindow)->counts)
      << "epoch 4, after the refused calls";

  // On --data_dir, with a SIGKILL after the call (logged, not yet in a snapshot): the same plans.
  ASSERT_NO_FATAL_FAILURE(Start(/*persisted=*/true));
  ASSERT_TRUE(client_->CreateJob("s", spec).ok());
  AwaitEpoch("s", 0);
  EXPECT_EQ(ReadPlan("s", 0), want[0]);
  EndAll("s", 0);
  AwaitEpoch("s", 1);
  EXPECT_EQ(ReadPlan("s", 1), want[1]);
  ASSERT_TRUE(client_->SetGroupWeights("s", set).ok());
  ASSERT_NO_FATAL_FAILURE(KillAndRestart());
  AwaitEpoch("s", 1);
  EXPECT_EQ(ReadPlan("s", 1), want[1]) << "after the restart";
  EndAll("s", 1);
  for (uint64_t e = 2; e < 5; ++e) {
    AwaitEpoch("s", e);
    EXPECT_EQ(ReadPlan("s", e), want[e]) << "epoch " << e << " after the restart";
    if (e < 4) EndAll("s", e);
  }
  // Weights set during epoch 4, then a rewind to epoch 4's start: the call is forgotten with
  // what followed the start; epoch 5 keeps the weights in force at 4.
  ASSERT_TRUE(client_->SetGroupWeights("s", {9.0, 1.0, 1.0, 1.0}).ok());
  absl::StatusOr<v1::Job> rewound = client_->RewindJob("s", 4);
  ASSERT_TRUE(rewound.ok()) << rewound.status();
  EXPECT_EQ(ReadPlan("s", 4), want[4]) << "after the rewind";
  EndAll("s", 4);
  AwaitEpoch("s", 5);
  EXPECT_EQ(CountsOf(layout, ReadPlan("s", 5)), apportioner.Next(new_shares, kWindow)->counts)
      << "epoch 5, after the rewind";
  ExpectSameBits(ServedWeights("s"), *mixture::NormalizeWeights(set, 4), "after the rewind");
}

// An online rule's run: after each epoch the served weights are GroupWeights::Update applied by
// hand to the statistics of the losses reported; a SIGKILL mid-epoch and a rewind replay the same
// weights and plans as the in-memory run.
class OnlineWeightsTest : public MixtureWeightsTest {
 public:
  void Run(v1::GroupWeightRule rule) {
    const v1::JobSpec spec = Spec(rule);
    std::shared_ptr<const MixtureConfig> config = *MakeMixtureConfig(spec.mixture(), 0);
    const mixture::GroupLayout& layout = config->layout;
    constexpr uint64_t kEpochs = 6;
    std::vector<std::vector<uint64_t>> want;
    std::vector<std::vector<double>> weights;  // In force at each epoch, by hand.
    mixture::GroupWeights by_hand = *config->initial;
    mixture::Apportioner apportioner = *mixture::Apportioner::Create(4);
    ASSERT_NO_FATAL_FAILURE(Start(/*persisted=*/false));
    ASSERT_TRUE(client_->CreateJob("o", spec).ok());
    for (uint64_t e = 0; e < kEpochs; ++e) {
      AwaitEpoch("o", e);
      weights.push_back(by_hand.weights());
      ExpectSameBits(ServedWeights("o"), weights[e], absl::StrCat("epoch ", e));
      want.push_back(ReadPlan("o", e));
      EXPECT_EQ(CountsOf(layout, want[e]),
                apportioner.Next(*mixture::SharesOf(weights[e]), kWindow)->counts)
          << "epoch " << e;
      Report("o", e, want[e], layout, 0, kWindow / kWorld);
      ASSERT_TRUE(by_hand.Update(StatsOf(layout, want[e], e)).ok());
      EndAll("o", e);
    }
    // The rule did move the weights: the unlearnable group 0 ends below uniform.
    EXPECT_LT(weights.back()[0], 0.25) << "group 0's final weight";
    EXPECT_GE(weights.back()[0], 0.1 / 4) << "the min_ratio bound";

    // Persisted: a SIGKILL with half of epoch 3's losses reported; the restart replays them.
    ASSERT_NO_FATAL_FAILURE(Start(/*persisted=*/true));
    ASSERT_TRUE(client_->CreateJob("o", spec).ok());
    for (uint64_t e = 0; e < kEpochs; ++e) {
      AwaitEpoch("o", e);
      ExpectSameBits(ServedWeights("o"), weights[e], absl::StrCat("persisted epoch ", e));
      EXPECT_EQ(ReadPlan("o", e), want[e]) << "persisted epoch " << e;
      Report("o", e, want[e], layout, 0, kWindow / kWorld / 2);
      if (e == 3) {
        ASSERT_NO_FATAL_FAILURE(KillAndRestart());
        AwaitEpoch("o", 3);
        EXPECT_EQ(ReadPlan("o", 3), want[3]) << "after the restart";
      }
      // The rest (a restarted rank reporting the first half again: duplicates, counted once).
      Report("o", e, want[e], layout, e == 3 ? 0 : kWindow / kWorld / 2, kWindow / kWorld);
      EndAll("o", e);
    }
    AwaitEpoch("o", kEpochs);
    ExpectSameBits(ServedWeights("o"), by_hand.weights(), "after the last epoch");
    // A rewind to epoch 4: its weights, then the same losses give the same weights and plans.
    absl::StatusOr<v1::Job> rewound = client_->RewindJob("o", 4);
    ASSERT_TRUE(rewound.ok()) << rewound.status();
    for (uint64_t e = 4; e < kEpochs; ++e) {
      AwaitEpoch("o", e);
      ExpectSameBits(ServedWeights("o"), weights[e], absl::StrCat("rewound epoch ", e));
      EXPECT_EQ(ReadPlan("o", e), want[e]) << "rewound epoch " << e;
      Report("o", e, want[e], layout, 0, kWindow / kWorld);
      EndAll("o", e);
    }
    AwaitEpoch("o", kEpochs);
    ExpectSameBits(ServedWeights("o"), by_hand.weights(), "after the rewound epochs");
  }
};

TEST_F(OnlineWeightsTest, ExcessLossWeightsAreTheRulesAndReplayAfterACrashAndARewind) {
  Run(v1::EXCESS_LOSS);
}

TEST_F(OnlineWeightsTest, Exp3WeightsAreTheRulesAndReplayAfterACrashAndARewind) {
  Run(v1::EXP3);
}

TEST_F(MixtureWeightsTest, OnlineSpecsAreCheckedAndBadLossesRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(/*persisted=*/false));
  v1::JobSpec spec = Spec(v1::EXCESS_LOSS);
  spec.mutable_mixture()->clear_reference_losses();
  absl::StatusOr<v1::Job> job = client_->CreateJob("x", spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.mixture.reference_losses"));
  spec = Spec(v1::EXP3);
  spec.mutable_mixture()->mutable_online()->set_eta(-1);
  job = client_->CreateJob("x", spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.mixture.online.eta = -1"));
  spec = Spec(v1::EXP3);
  spec.mutable_mixture()->mutable_online()->set_max_ratio(0.5);
  job = client_->CreateJob("x", spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.mixture.online.max_ratio = 0.5"));
  // A loss of 2^32 or more cannot be summed exactly: the batch is refused whole.
  ASSERT_TRUE(client_->CreateJob("x", Spec(v1::EXP3)).ok());
  AwaitEpoch("x", 0);
  const std::vector<uint64_t> plan = ReadPlan("x", 0);
  v1::LossBatch b;
  b.set_job("x");
  b.set_epoch(0);
  b.set_rank(0);
  b.set_seq(1);
  b.add_positions(0);
  b.add_indices(plan[0]);
  b.add_losses(5e9f);
  absl::StatusOr<v1::LossReportSummary> sent = client_->ReportLosses({b});
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sent.status().message()), HasSubstr("below 2^32"));
  absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus("x");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->ranks(0).losses_accepted(), 0u);
}

}  // namespace
}  // namespace samplerd
