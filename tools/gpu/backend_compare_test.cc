// The backend comparison against two real samplerd processes (the Bazel-built binary, port 0):
// two CPU servers must agree bit for bit on every job; a different seed on one of them, or one
// different loss, must be found and named (job, epoch, rank, position); bad options are refused;
// the compare_backends binary's exit status says which; the boundary timer times a small job.
#include "tools/gpu/backend_compare.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/samplerd_process.h"
#include "tools/gpu/epoch_boundary_timer.h"
#include "tools/gpu/synthetic_inputs.h"

namespace samplerd {
namespace gpu_e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kSamplerd[] = "server/samplerd";
constexpr char kTool[] = "tools/gpu/compare_backends";

class BackendCompareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& server : servers_) {
      server = std::make_unique<testutil::SamplerdProcess>(
          kSamplerd, 0, std::vector<std::string>{"--backend=cpu"});
      ASSERT_FALSE(server->address().empty()) << "samplerd did not start";
    }
    a_ = *SamplerClient::Create(servers_[0]->address());
    b_ = *SamplerClient::Create(servers_[1]->address());
  }

  CompareOptions Options(const std::string& prefix, std::vector<uint64_t> sizes) {
    CompareOptions options;
    options.sizes = std::move(sizes);
    options.job_prefix = prefix;
    options.log = [this](const std::string& line) { lines_.push_back(line); };
    return options;
  }

  // Runs the compare_backends binary with `flags`; returns its exit status, output in *out.
  int RunTool(const std::string& flags, std::string* out) {
    const std::string command = absl::StrCat(kTool, " --a=", servers_[0]->address(),
                                             " --b=", servers_[1]->address(), " ", flags, " 2>&1");
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return -1;
    char buffer[4096];
    while (fgets(buffer, sizeof buffer, pipe) != nullptr) out->append(buffer);
    const int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::unique_ptr<testutil::SamplerdProcess> servers_[2];
  std::unique_ptr<SamplerClient> a_, b_;
  std::vector<std::string> lines_;
};

TEST_F(BackendCompareTest, TwoCpuServersAgreeOnEveryJob) {
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, Options("eq", {1000, 12345}));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->difference, "");
  EXPECT_EQ(summary->jobs_compared, 2 * 39);
  EXPECT_EQ(summary->backend_a, "cpu");
  EXPECT_EQ(summary->backend_b, "cpu");
  ASSERT_EQ(lines_.size(), 2u * 39);
  EXPECT_THAT(lines_[0], StartsWith("OK eq-n1000-sequential-w2 "));
  EXPECT_THAT(lines_[lines_.size() - 3], StartsWith("OK eq-n12345-balanced-mult-repl-m12345-w2 "));
  EXPECT_THAT(lines_[lines_.size() - 2], StartsWith("OK eq-n12345-mixture-static-w3 "));
  EXPECT_THAT(lines_.back(), StartsWith("OK eq-n12345-mixture-exp3-w2 "));
  // Every job was deleted on both servers after it was compared.
  EXPECT_TRUE(a_->ListJobs()->empty());
  EXPECT_TRUE(b_->ListJobs()->empty());
}

TEST_F(BackendCompareTest, TheFilterPicksJobsByName) {
  CompareOptions options = Options("only", {1000, 2000});
  options.job_filter = {"-n2000-static-", "-sequential-"};
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->difference, "");
  EXPECT_EQ(summary->jobs_compared, 2 + 12);
}

TEST_F(BackendCompareTest, AnotherSeedOnBIsFoundInTheFirstShuffledJob) {
  CompareOptions options = Options("seed", {1000});
  options.testonly_b_seed_xor = 1;
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // The sequential job does not depend on the seed: equal. The next one differs at once.
  EXPECT_EQ(summary->jobs_compared, 1);
  EXPECT_THAT(summary->difference,
              StartsWith("job=seed-n1000-uniform-none-norepl-m100-w3 epoch=0 rank=0 position="));
  EXPECT_THAT(summary->difference, HasSubstr(" | b index="));
}

// The mixture jobs' windows depend on the seed: a different one on b is found at epoch 0.
TEST_F(BackendCompareTest, AnotherSeedOnBIsFoundInTheMixtureJobs) {
  CompareOptions options = Options("mixseed", {1000});
  options.job_filter = {"-mixture-"};
  options.testonly_b_seed_xor = 1;
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->jobs_compared, 0);
  EXPECT_THAT(summary->difference,
              StartsWith("job=mixseed-n1000-mixture-static-w3 epoch=0 rank=0 position="));
}

// The EXP3 mixture job learns its group weights from the losses: one changed loss of epoch 0
// changes the group's loss average, which EXP3 first rewards (a decrease) at the update after
// epoch 1, so the weights of epoch 2 differ; the windows' counts do not yet (the same 23 of
// group 0): only the comparison of GetJobStatus's groups sees it.
TEST_F(BackendCompareTest, OneChangedLossIsFoundInTheOnlineMixtureJob) {
  CompareOptions options = Options("mixloss", {1000});
  options.job_filter = {"-mixture-"};
  options.testonly_b_loss_changed = true;
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->jobs_compared, 1);  // The static job ignores losses.
  EXPECT_THAT(
      summary->difference,
      StartsWith("job=mixloss-n1000-mixture-exp3-w2 epoch=2 JobStatus.mixture.top_groups["));
}

TEST_F(BackendCompareTest, OneChangedLossIsFoundAtTheNextEpoch) {
  CompareOptions options = Options("loss", {1000});
  options.testonly_b_loss_changed = true;
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // The jobs without a loss policy ignore losses: equal. The first LOSS job differs once its
  // weights were recomputed from the losses of epoch 0.
  EXPECT_EQ(summary->jobs_compared, 5);
  EXPECT_THAT(summary->difference,
              StartsWith("job=loss-n1000-uniform-loss-norepl-m100-w3 epoch=1 "));
}

TEST_F(BackendCompareTest, BadOptionsAreRefusedNamingTheOption) {
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, Options("bad", {1000, 5}));
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(summary.status().message(), HasSubstr("sizes: N = 5 is below 10"));
  CompareOptions options = Options("bad", {1000});
  options.epochs = 0;
  summary = CompareBackends(*a_, *b_, options);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(summary.status().message(), HasSubstr("epochs = 0"));
  EXPECT_TRUE(a_->ListJobs()->empty());
}

TEST_F(BackendCompareTest, AJobLeftByAnEarlierRunIsAnError) {
  CompareOptions options = Options("left", {1000});
  options.testonly_b_seed_xor = 1;  // Stops at the second job, leaving it on both servers.
  ASSERT_TRUE(CompareBackends(*a_, *b_, options).ok());
  options.testonly_b_seed_xor = 0;
  // The leftover job is at epoch 0 (the difference was found before any loss): CreateJob
  // returns it as it is, which is fine; push it past epoch 0 first.
  ASSERT_TRUE(a_->EndEpoch("left-n1000-uniform-none-norepl-m100-w3", 0, 0).ok());
  ASSERT_TRUE(a_->EndEpoch("left-n1000-uniform-none-norepl-m100-w3", 0, 1).ok());
  ASSERT_TRUE(a_->EndEpoch("left-n1000-uniform-none-norepl-m100-w3", 0, 2).ok());
  absl::StatusOr<CompareSummary> summary = CompareBackends(*a_, *b_, options);
  EXPECT_FALSE(summary.ok());
  EXPECT_THAT(summary.status().message(),
              HasSubstr("server a: job left-n1000-uniform-none-norepl-m100-w3"));
}

TEST_F(BackendCompareTest, TheBinaryExitsZeroWhenEqualAndOneOnADifference) {
  std::string out;
  EXPECT_EQ(RunTool("--sizes=1e3 --job_prefix=bin", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("EQUAL jobs=39 "));
  out.clear();
  EXPECT_EQ(RunTool("--sizes=1000 --job_prefix=bin2 --testonly_b_seed_xor=7", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("DIFFERENCE job=bin2-n1000-uniform-none-norepl-m100-w3 epoch=0 "));
  out.clear();
  EXPECT_EQ(RunTool("--sizes=1000,x", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("--sizes: 'x' is not a positive integer"));
}

TEST_F(BackendCompareTest, BoundaryTimerTimesEveryBoundaryAndDeletesItsJob) {
  BoundaryOptions options;
  options.num_samples = 100000;
  options.boundaries = 2;
  options.losses_per_rank = 3000;
  absl::StatusOr<BoundaryTiming> timing = TimeEpochBoundaries(*a_, options);
  ASSERT_TRUE(timing.ok()) << timing.status();
  ASSERT_EQ(timing->boundary_ms.size(), 2u);
  for (double ms : timing->boundary_ms) EXPECT_GT(ms, 0);
  EXPECT_EQ(timing->backend, "cpu");
  EXPECT_THAT(FormatBoundaryTiming(options, *timing),
              StartsWith("BOUNDARY backend=cpu n=100000 m=10000 world=2 boundaries=2 median_ms="));
  EXPECT_TRUE(a_->ListJobs()->empty());
  options.losses_per_rank = 0;
  EXPECT_EQ(TimeEpochBoundaries(*a_, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticInputsTest, WeightsHaveZerosTiesAndBoundedExtremeRatios) {
  int zeros = 0, ones = 0;
  float lo = 1, hi = 1;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float w = SyntheticWeight(3, i);
    ASSERT_GE(w, 0.0f);
    if (w == 0) {
      ++zeros;
      continue;
    }
    if (w == 1) ++ones;
    lo = std::min(lo, w);
    hi = std::max(hi, w);
  }
  EXPECT_GT(zeros, 5000);
  EXPECT_GT(ones, 5000);
  EXPECT_GT(hi / lo, 0x1p100f);  // Extreme ...
  EXPECT_LE(hi / lo, 0x1p126f);  // ... but inside the API's bound.
  EXPECT_EQ(SyntheticWeight(3, 0), 1.0f);
  EXPECT_EQ(SyntheticLoss(1, 2, 3), SyntheticLoss(1, 2, 3));
  EXPECT_NE(SyntheticLoss(1, 2, 3), SyntheticLoss(1, 3, 3));
}

}  // namespace
}  // namespace gpu_e2e
}  // namespace samplerd
