// A mixture job's spec through MakeJobConfig (the one entry point): what it accepts, what it
// fills in, and every bad input named by field, group and value.
#include "server/mixture_config.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_config.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

v1::JobSpec MixtureSpec(std::initializer_list<uint64_t> sizes) {
  v1::JobSpec spec;
  spec.set_world_size(2);
  spec.set_samples_per_epoch(10);
  for (uint64_t n : sizes) spec.mutable_mixture()->add_group_sizes(n);
  return spec;
}

TEST(MixtureConfigTest, TenToTheTwelveSamplesInTenThousandGroupsIsAccepted) {
  v1::JobSpec spec;
  spec.set_world_size(4);
  spec.set_samples_per_epoch(1000);
  for (int k = 0; k < 10000; ++k) spec.mutable_mixture()->add_group_sizes(100000000);
  // --max_samples_per_job (2^32 by default) does not apply: nothing is kept per sample.
  absl::StatusOr<JobConfig> c = MakeJobConfig(spec, JobLimits());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->plan.num_samples, uint64_t{1000000000000});
  EXPECT_EQ(c->normalized.num_samples(), uint64_t{1000000000000});  // Filled in.
  ASSERT_NE(c->mixture, nullptr);
  EXPECT_EQ(c->mixture->layout.groups(), 10000u);
  // No weights given: proportional to the sizes (here equal).
  EXPECT_DOUBLE_EQ(c->mixture->weights[17], 1e-4);
  EXPECT_FALSE(c->plan.replacement);
  EXPECT_EQ(c->policy.base, BaseWeightKind::kUniform);
  EXPECT_EQ(c->policy.loss, LossWeightKind::kNone);
}

// The window M is bounded by the shuffle (2^34), not by 16 x --max_samples_per_job.
TEST(MixtureConfigTest, TheWindowIsNotBoundByMaxSamplesPerJob) {
  v1::JobSpec spec = MixtureSpec({1000, 1000});
  spec.set_samples_per_epoch(1000);
  JobLimits limits;
  limits.max_samples_per_job = 10;  // 16 x 10 = 160 < M.
  absl::StatusOr<JobConfig> c = MakeJobConfig(spec, limits);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->plan.samples_per_epoch, 1000u);
  spec.set_samples_per_epoch((uint64_t{1} << 34) + 1);
  EXPECT_THAT(std::string(MakeJobConfig(spec, limits).status().message()),
              HasSubstr("spec.samples_per_epoch = 17179869185: a mixture job's window holds 1 to "
                        "17179869184"));
}

// An enum value this server does not know is named by its number (it has no name).
TEST(MixtureConfigTest, AnUnknownOrderIsNamedByItsNumber) {
  v1::JobSpec spec = MixtureSpec({3, 5});
  spec.set_order(static_cast<v1::Order>(77));
  absl::StatusOr<JobConfig> c = MakeJobConfig(spec, JobLimits());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("unknown enum value (order = 77,"));
  spec.set_order(v1::ORDER_UNSPECIFIED);
  spec.mutable_policy()->set_loss(static_cast<v1::LossPolicy>(99));
  EXPECT_THAT(std::string(MakeJobConfig(spec, JobLimits()).status().message()),
              HasSubstr("policy.loss = 99)"));
}

// Huge finite weights whose sum overflows are proportions all the same (not "all weights are 0").
TEST(MixtureConfigTest, WeightsWhoseSumOverflowsAreAccepted) {
  v1::JobSpec spec = MixtureSpec({3, 5});
  spec.mutable_mixture()->add_group_weights(1e308);
  spec.mutable_mixture()->add_group_weights(1e308);
  absl::StatusOr<JobConfig> c = MakeJobConfig(spec, JobLimits());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mixture->weights, (std::vector<double>{0.5, 0.5}));
}

TEST(MixtureConfigTest, WeightsAreNormalisedAndTheSpecKeepsThemAsGiven) {
  v1::JobSpec spec = MixtureSpec({3, 5});
  spec.mutable_mixture()->add_group_weights(1);
  spec.mutable_mixture()->add_group_weights(3);
  spec.mutable_mixture()->add_reference_losses(2.5);
  spec.mutable_mixture()->add_reference_losses(0);
  spec.set_num_samples(8);
  absl::StatusOr<JobConfig> c = MakeJobConfig(spec, JobLimits());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->mixture->weights[0], 0.25);
  EXPECT_DOUBLE_EQ(c->mixture->weights[1], 0.75);
  EXPECT_EQ(c->mixture->shares[0] + c->mixture->shares[1], uint64_t{1} << 63);
  EXPECT_EQ(c->mixture->reference_losses.size(), 2u);
  EXPECT_EQ(c->normalized.mixture().group_weights(1), 3);
  // The same spec with num_samples left 0 normalises to the same spec (idempotent CreateJob).
  v1::JobSpec unset = spec;
  unset.set_num_samples(0);
  absl::StatusOr<JobConfig> d = MakeJobConfig(unset, JobLimits());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(c->normalized.SerializeAsString(), d->normalized.SerializeAsString());
}

TEST(MixtureConfigTest, RejectsBadMixturesNamingFieldGroupAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(v1::JobSpec*)> mutate;
    std::string want;
  } cases[] = {
      {[](v1::JobSpec* s) { s->mutable_mixture()->clear_group_sizes(); },
       "spec.mixture.group_sizes: 0 groups; a mixture has 1 to 1000000 groups"},
      {[](v1::JobSpec* s) { s->mutable_mixture()->set_group_sizes(1, 0); },
       "spec.mixture.group_sizes[1] = 0"},
      {[](v1::JobSpec* s) { s->set_num_samples(9); },
       "spec.num_samples = 9: the 3 groups of spec.mixture.group_sizes hold 10 samples"},
      {[](v1::JobSpec* s) {
         s->mutable_mixture()->add_group_sizes(uint64_t{1} << 62);
         s->mutable_mixture()->add_group_sizes(uint64_t{1} << 62);
       },
       "spec.mixture.group_sizes: the groups up to sizes[4]"},
      {[](v1::JobSpec* s) {
         s->mutable_mixture()->clear_group_sizes();
         for (int k = 0; k < 1000001; ++k) s->mutable_mixture()->add_group_sizes(1);
       },
       "spec.mixture.group_sizes: 1000001 groups"},
      {[](v1::JobSpec* s) { s->mutable_mixture()->add_group_weights(1); },
       "spec.mixture.group_weights: 1 weights for 3 groups"},
      {[](v1::JobSpec* s) {
         for (double w : {1.0, -2.0, 1.0}) s->mutable_mixture()->add_group_weights(w);
       },
       "spec.mixture.group_weights[1] = -2"},
      {[nan](v1::JobSpec* s) {
         for (double w : {1.0, 1.0, nan}) s->mutable_mixture()->add_group_weights(w);
       },
       "spec.mixture.group_weights[2] = nan"},
      {[](v1::JobSpec* s) {
         for (double w : {0.0, 0.0, 0.0}) s->mutable_mixture()->add_group_weights(w);
       },
       "spec.mixture.group_weights: all 3 group weights are 0"},
      {[](v1::JobSpec* s) { s->mutable_mixture()->add_reference_losses(1); },
       "spec.mixture.reference_losses: 1 reference losses for 3 groups"},
      {[inf](v1::JobSpec* s) {
         for (double r : {1.0, inf, 1.0}) s->mutable_mixture()->add_reference_losses(r);
       },
       "spec.mixture.reference_losses[1] = inf"},
      {[](v1::JobSpec* s) { s->set_samples_per_epoch(0); }, "spec.samples_per_epoch = 0"},
      {[](v1::JobSpec* s) { s->set_samples_per_epoch((uint64_t{1} << 34) + 1); },
       "spec.samples_per_epoch = 17179869185"},
      {[](v1::JobSpec* s) { s->set_replacement(true); }, "spec.replacement = true"},
      {[](v1::JobSpec* s) { s->set_order(v1::SEQUENTIAL); }, "spec.order = SEQUENTIAL"},
      {[](v1::JobSpec* s) { s->mutable_policy()->set_loss(v1::LOSS); }, "spec.policy = {"},
      {[](v1::JobSpec* s) { s->mutable_policy()->set_mix(0.5); }, "spec.policy = {"},
      {[](v1::JobSpec* s) { s->set_world_size(0); }, "spec.world_size = 0"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = MixtureSpec({2, 3, 5});
    c.mutate(&spec);
    absl::StatusOr<JobConfig> config = MakeJobConfig(spec, JobLimits());
    ASSERT_FALSE(config.ok()) << c.want;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.want));
  }
  // The plain policy spelled out is the default, not a policy.
  v1::JobSpec spec = MixtureSpec({2, 3, 5});
  spec.mutable_policy()->set_base(v1::UNIFORM);
  spec.mutable_policy()->set_loss(v1::NONE);
  EXPECT_TRUE(MakeJobConfig(spec, JobLimits()).ok());
}

}  // namespace
}  // namespace samplerd
