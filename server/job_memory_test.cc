// The memory estimate of a job: its table, and a bound on what a real Job takes.
#include "server/job_memory.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/testing/peak_memory.h"
#include "server/job.h"
#include "server/mixture_planner.h"
#include "server/testing/job_shards.h"
#include "server/testing/loss_batches.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(uint64_t n, uint64_t m, bool replacement, v1::BasePolicy base = v1::UNIFORM,
                 v1::LossPolicy loss = v1::NONE) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_samples_per_epoch(m);
  spec.set_world_size(1);
  spec.set_replacement(replacement);
  spec.mutable_policy()->set_base(base);
  spec.mutable_policy()->set_loss(loss);
  return spec;
}

JobConfig Config(const v1::JobSpec& spec) {
  JobLimits limits;
  limits.max_samples_per_job = uint64_t{1} << 40;
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

class JobMemoryTest : public ::testing::Test {
 protected:
  JobMemoryEstimate Estimate(const v1::JobSpec& spec) {
    return EstimateJobMemory(Config(spec), *backend_, /*persisted=*/false);
  }
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
};

// Issue 9, defect 4: a uniform job with replacement needs no per-sample state at all.
TEST_F(JobMemoryTest, UniformWithReplacementNeedsNothingPerSample) {
  const JobMemoryEstimate e = Estimate(Spec(1'000'000'000, 1000, true));
  EXPECT_EQ(e.plans, 2 * 1000 * 4u);
  EXPECT_EQ(e.weights, 0u);
  EXPECT_EQ(e.loss_stats, 0u);
  EXPECT_EQ(e.scratch, 0u);
  EXPECT_LT(e.total(), 10'000u);
  EXPECT_EQ(e.driving_field, "spec.samples_per_epoch");
  EXPECT_EQ(e.driving_value, 1000u);
}

TEST_F(JobMemoryTest, PerSampleStateOnlyWhereTheSpecNeedsIt) {
  const uint64_t n = 100'000'000;
  // Static weights with replacement: the base, an upload, and the draw table (~10 B).
  const JobMemoryEstimate st = Estimate(Spec(n, n, true, v1::STATIC));
  EXPECT_EQ(st.weights, 8 * n);
  EXPECT_EQ(st.loss_stats, 0u);
  EXPECT_GE(st.scratch, 8 * n);
  EXPECT_LE(st.scratch, 11 * n);
  EXPECT_EQ(st.driving_field, "spec.num_samples");
  // A loss policy: its statistics and two epochs' weights; M == N without replacement needs no
  // selection, only the shuffle's few MiB, plus (beyond 2^24 samples) the 2 bytes per sample of
  // its second partition pass (docs/SAMPLING.md).
  const JobMemoryEstimate loss = Estimate(Spec(n, 0, false, v1::UNIFORM, v1::LOSS));
  EXPECT_EQ(loss.plans, 2 * 4 * n);
  EXPECT_EQ(loss.weights, 8 * n);
  EXPECT_EQ(loss.loss_stats, 8 * n);
  EXPECT_GE(loss.scratch, 2 * n);
  EXPECT_LT(loss.scratch, 2 * n + (uint64_t{64} << 20));
  // REDUCIBLE_LOSS: LOSS's state and the irreducible losses, 4 bytes per sample.
  const JobMemoryEstimate reducible = Estimate(Spec(n, 0, false, v1::UNIFORM, v1::REDUCIBLE_LOSS));
  EXPECT_EQ(reducible.weights, 8 * n + 4 * n);
  EXPECT_EQ(reducible.loss_stats, 8 * n);
  EXPECT_EQ(reducible.total(), loss.total() + 4 * n);
  // Without replacement and M < N: the selection keys.
  EXPECT_GE(Estimate(Spec(n, n / 2, false)).scratch, 8 * n);
  // Beyond 2^32 samples an index takes 8 bytes.
  const uint64_t wide = (uint64_t{1} << 32) + 1;
  EXPECT_EQ(Estimate(Spec(wide, 1000, true)).plans, 2 * 1000 * 8u);
}

TEST_F(JobMemoryTest, SaturatesAndSaysWhichFieldDrivesIt) {
  const JobMemoryEstimate e = Estimate(Spec(1, uint64_t{1} << 36, true));
  EXPECT_EQ(e.plans, uint64_t{1} << 39);  // 2 plans x 2^36 x 4 bytes: 512 GiB.
  EXPECT_EQ(e.driving_field, "spec.samples_per_epoch");
  EXPECT_EQ(e.driving_value, uint64_t{1} << 36);
  // M = N (the default): the plans grow with N, which is what the client chose.
  const JobMemoryEstimate all = Estimate(Spec(uint64_t{1} << 32, 0, false));
  EXPECT_EQ(all.driving_field, "spec.num_samples");
  EXPECT_EQ(all.driving_value, uint64_t{1} << 32);
  EXPECT_THAT(e.ToString(), HasSubstr("plans 512.0 GiB"));
  JobMemoryEstimate huge;
  huge.plans = ~uint64_t{0} - 1;
  huge.weights = 5;
  EXPECT_EQ(huge.total(), ~uint64_t{0});
  EXPECT_EQ(FormatBytes(1536), "1536 bytes (1.5 KiB)");
}

// A mixture job keeps nothing per sample: N = 10^12 in 10^4 groups with a window of 10^7 is
// its plans (8-byte indices) plus O(K) (bench/RESULTS.md, "Mixture jobs served": peak RSS
// 182 MiB of a whole server with such a job).
TEST_F(JobMemoryTest, AMixtureJobIsItsPlansAndItsGroups) {
  v1::JobSpec spec;
  spec.set_world_size(8);
  spec.set_samples_per_epoch(10'000'000);
  for (int k = 0; k < 10'000; ++k) spec.mutable_mixture()->add_group_sizes(100'000'000);
  const JobMemoryEstimate e = Estimate(spec);
  EXPECT_EQ(e.plans, 2 * 10'000'000 * 8u);
  EXPECT_EQ(e.weights, 88 * 10'000u + MixturePlanner::kWeightHistoryBytes);
  EXPECT_EQ(e.loss_stats, 0u);
  EXPECT_GT(e.scratch, 6 * 32 * 10'000u);  // The groups' states and the shuffle's scratch.
  EXPECT_LT(e.scratch, 32u << 20);
  // The window's scratch is the backend's (the CPU backend's shuffle scratch here).
  EXPECT_EQ(e.scratch, MixturePlanner::ScratchBytes(*backend_, 10'000, 10'000'000,
                                                    uint64_t{10'000} * 100'000'000));
  EXPECT_GT(e.scratch, backend_->MixtureWindowScratchBytes(10'000, 10'000'000));
  EXPECT_LT(e.total(), 200u << 20);
  EXPECT_EQ(e.driving_field, "spec.samples_per_epoch");
  // Groups that weigh more than the plans drive it: K.
  v1::JobSpec many;
  many.set_world_size(1);
  many.set_samples_per_epoch(10);
  for (int k = 0; k < 100'000; ++k) many.mutable_mixture()->add_group_sizes(3);
  const JobMemoryEstimate g = Estimate(many);
  EXPECT_EQ(g.driving_field, "spec.mixture.group_sizes");
  EXPECT_EQ(g.driving_value, 100'000u);
}

TEST(DefaultMaxMemoryBytesTest, IsAShareOfThisMachine) {
  const uint64_t physical =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_GT(DefaultMaxMemoryBytes(), 0u);
  EXPECT_LE(DefaultMaxMemoryBytes(), physical / 5 * 4);
}

// What a real job takes at its peak (created, uploaded, two epoch boundaries with every sample
// reported) stays within its estimate. Measured in a forked child: VmHWM over the RSS before.
struct MeasuredCase {
  std::string name;
  v1::JobSpec spec;
};

TEST_F(JobMemoryTest, EstimateBoundsWhatAJobReallyTakes) {
  if (const char* why = testutil::ResidentMemoryNotTheProgramsBecause(); *why != '\0') {
    GTEST_SKIP() << why;
  }
  constexpr uint64_t kN = uint64_t{1} << 21;
  constexpr uint64_t kSlack = uint64_t{12} << 20;  // Threads' stacks and arenas, the protos.
  const std::vector<MeasuredCase> cases = {
      {"uniform, loss, M = N without replacement", Spec(kN, 0, false, v1::UNIFORM, v1::LOSS)},
      {"static, with replacement", Spec(kN, kN, true, v1::STATIC)},
      {"static, multiplicative, M = N / 2 without replacement",
       Spec(kN, kN / 2, false, v1::STATIC, v1::MULTIPLICATIVE)},
      {"class balanced, loss, M = 2N with replacement",
       Spec(kN, 2 * kN, true, v1::CLASS_BALANCED, v1::LOSS)},
      {"uniform, with replacement, M = 1000", Spec(kN, 1000, true)},
  };
  for (const MeasuredCase& c : cases) {
    SCOPED_TRACE(c.name);
    const JobConfig config = Config(c.spec);
    const JobMemoryEstimate estimate = EstimateJobMemory(config, *backend_, /*persisted=*/false);
    auto run = [&] {
      auto job = Job::Create("m", config, backend_.get());
      if (!job.ok()) _exit(2);
      if (config.policy.base == BaseWeightKind::kStatic) {
        std::vector<float> w(kN);
        for (uint64_t i = 0; i < kN; ++i) w[i] = 0.5f + static_cast<float>(i % 7);
        if (!(*job)->UploadWeights(std::move(w)).ok()) _exit(3);
      } else if (config.policy.base == BaseWeightKind::kClassBalanced) {
        std::vector<uint32_t> labels(kN);
        for (uint64_t i = 0; i < kN; ++i) labels[i] = static_cast<uint32_t>(i % 10);
        if (!(*job)->UploadLabels(labels).ok()) _exit(4);
      }
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        auto lease = testutil::AwaitShard(**job, epoch, 0, 0, 1, absl::Now() + absl::Seconds(60));
        if (!lease.ok()) _exit(5);
        // Every position of the shard reported, in batches of 2^16 (a buffer of one batch: the
        // test's own memory stays out of the measurement).
        std::vector<uint64_t> chunk;
        for (uint64_t start = 0; start < lease->shard_length; start += 1 << 16) {
          chunk.resize(std::min<uint64_t>(1 << 16, lease->shard_length - start));
          if (!backend_
                   ->ExtractShard(*lease->view.plan, lease->shard, 0, start, absl::MakeSpan(chunk))
                   .ok()) {
            _exit(9);
          }
          testutil::OwnedLossBatch batch =
              testutil::BatchOfRange(epoch, 0, start, chunk, 0, chunk.size(),
                                     [](uint64_t i) { return static_cast<float>(i % 13); });
          for (uint64_t& p : batch.positions) p += start;
          v1::LossReportSummary summary;
          if (!(*job)->ReportLosses(batch.view(), &summary).ok()) _exit(6);
        }
        lease = absl::CancelledError("released");  // Its plan is the job's to free, not ours.
        if (!(*job)->EndEpoch(epoch, 0, 0).ok()) _exit(7);
      }
      if (!testutil::AwaitShard(**job, 2, 0, 0, 1, absl::Now() + absl::Seconds(60)).ok()) _exit(8);
    };
    const testutil::PeakGrowth growth = testutil::PeakResidentGrowth([] {}, run);
    if (!growth.supported) GTEST_SKIP() << "/proc/self/clear_refs cannot reset VmHWM here";
    ASSERT_EQ(growth.exit_code, 0) << "the measured code failed";
    std::printf("%s: growth %.1f MiB, estimate %.1f MiB (%s)\n", c.name.c_str(),
                growth.bytes / 1048576.0, estimate.total() / 1048576.0,
                estimate.ToString().c_str());
    EXPECT_LE(growth.bytes, estimate.total() + kSlack) << estimate.ToString();
  }
}

}  // namespace
}  // namespace samplerd
