#include "server/epoch_planner.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/testing/backend_state.h"
#include "kernels/testing/test_util.h"
#include "server/mixture_planner.h"
#include "server/testing/gated_backend.h"

namespace samplerd {
namespace {

JobConfig Config(uint64_t n, uint64_t m, v1::LossPolicy loss) {
  v1::JobSpec spec;
  spec.set_num_samples(n);
  spec.set_samples_per_epoch(m);
  spec.set_world_size(1);
  spec.set_seed(11);
  spec.mutable_policy()->set_loss(loss);
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, JobLimits());
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::shared_ptr<const BackendWeights> Uniform() { return nullptr; }

class EpochPlannerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ComputeBackend> backend_ = NewCpuBackend(2);
};

TEST_F(EpochPlannerTest, PlanIsTheBackendsPlan) {
  const JobConfig config = Config(1000, 100, v1::NONE);
  EpochPlanner planner(config, backend_.get());
  absl::StatusOr<PlannedEpoch> planned = planner.Plan(3, Uniform());
  ASSERT_TRUE(planned.ok()) << planned.status();
  absl::StatusOr<Plan> direct = backend_->PlanEpoch(config.plan, 3, {});
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(planned->epoch, 3u);
  EXPECT_EQ(testutil::PlanIndices(*planned->view.plan), testutil::PlanIndices(*direct));
  EXPECT_TRUE(planned->view.unit_is_weights);
  EXPECT_EQ(planned->weight_summary.effective_sample_size, 1000.0);
}

TEST_F(EpochPlannerTest, PlanAheadIsTakenForTheNextEpochOnly) {
  const JobConfig config = Config(1000, 1000, v1::LOSS);  // Every index once: plans ahead.
  ASSERT_TRUE(EpochPlanner::PlanIgnoresWeights(config));
  testutil::GatedBackend gated(backend_.get());
  EpochPlanner planner(config, &gated);
  absl::StatusOr<PlannedEpoch> first = planner.Plan(0, Uniform());
  ASSERT_TRUE(first.ok());
  planner.PlanAhead(*first);
  // Plan(1) takes the plan computed ahead: held plans would block it otherwise.
  absl::StatusOr<PlannedEpoch> ahead = planner.Plan(1, Uniform());
  ASSERT_TRUE(ahead.ok());
  absl::StatusOr<Plan> direct = backend_->PlanEpoch(config.plan, 1, {});
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(testutil::PlanIndices(*ahead->view.plan), testutil::PlanIndices(*direct));
}

TEST_F(EpochPlannerTest, StartNextRecomputesThenPlans) {
  const JobConfig config = Config(500, 100, v1::LOSS);
  EpochPlanner planner(config, backend_.get());
  std::vector<SampleLossStats> stats(500);
  for (uint64_t i = 0; i < 500; i += 3) stats[i] = {static_cast<float>(i % 7), 1, EpochMarker(0)};
  absl::StatusOr<std::unique_ptr<BackendLossStats>> losses =
      testutil::LossStatsOf(*backend_, stats);
  ASSERT_TRUE(losses.ok()) << losses.status();
  RecomputeInputs inputs;
  inputs.current = Uniform();
  inputs.losses = losses->get();
  absl::Notification done;
  absl::StatusOr<PlannedEpoch> result = absl::UnknownError("not run");
  ASSERT_TRUE(planner.StartNext(0, inputs, [&](absl::StatusOr<PlannedEpoch> planned) {
    result = std::move(planned);
    done.Notify();
  }));
  done.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<float> ones(500, 1.0f);
  absl::StatusOr<std::vector<float>> want =
      testutil::RecomputeWith(*backend_, config.policy, 0, {}, ones, stats);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_NE(result->view.weights, nullptr);
  EXPECT_EQ(testutil::HostWeights(result->view.weights.get(), 500), *want);
  // The summary is the weights' own (computed when the backend made them).
  const WeightSummary summary = SummarizeWeights(*want);
  EXPECT_EQ(result->weight_summary.mean, summary.mean);
  EXPECT_EQ(result->weight_summary.effective_sample_size, summary.effective_sample_size);
  EXPECT_EQ(result->weight_summary.max, summary.max);
  EXPECT_LT(result->weight_summary.effective_sample_size, 500.0);
  absl::StatusOr<Plan> plan = testutil::PlanWith(*backend_, config.plan, 1, *want);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(result->epoch, 1u);
  EXPECT_EQ(testutil::PlanIndices(*result->view.plan), testutil::PlanIndices(*plan));
  EXPECT_FALSE(result->view.unit_is_weights);
}

TEST_F(EpochPlannerTest, NothingStartsAfterStop) {
  const JobConfig config = Config(100, 100, v1::NONE);
  EpochPlanner planner(config, backend_.get());
  planner.Stop();
  RecomputeInputs inputs;
  inputs.current = Uniform();
  bool ran = false;
  EXPECT_FALSE(planner.StartNext(0, inputs, [&](absl::StatusOr<PlannedEpoch>) { ran = true; }));
  planner.Stop();
  EXPECT_FALSE(ran);
}

// A mixture job's window is the backend's (ComputeBackend::PlanMixtureWindow): a held backend
// holds the mixture job's plan too (it was computed on the host whatever the backend before),
// and the plan is the MixturePlanner's on that backend.
TEST_F(EpochPlannerTest, AMixtureJobsWindowIsTheBackends) {
  v1::JobSpec spec;
  spec.set_samples_per_epoch(37);
  spec.set_world_size(1);
  spec.set_seed(11);
  for (uint64_t n : {5, 17, 2, 1000}) spec.mutable_mixture()->add_group_sizes(n);
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, JobLimits());
  ASSERT_TRUE(config.ok()) << config.status();
  testutil::GatedBackend gated(backend_.get());
  EpochPlanner planner(*config, &gated);
  gated.Hold();
  absl::Notification planned;
  absl::StatusOr<PlannedEpoch> result = absl::UnknownError("not run");
  std::thread plan([&] {
    result = planner.Plan(0, Uniform());
    planned.Notify();
  });
  EXPECT_FALSE(planned.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the mixture job's plan did not wait for the held backend";
  if (!planned.HasBeenNotified()) gated.AwaitHeldCall();
  gated.Release();
  plan.join();
  ASSERT_TRUE(result.ok()) << result.status();
  MixturePlanner direct(config->mixture, 11, 37, backend_.get());
  absl::StatusOr<MixturePlan> want = direct.PlanEpoch(0);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(testutil::PlanIndices(*result->view.plan), testutil::PlanIndices(want->plan));
}

}  // namespace
}  // namespace samplerd
