#include "server/job_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Minimal() {
  v1::JobSpec spec;
  spec.set_num_samples(100);
  spec.set_world_size(4);
  return spec;
}

TEST(JobConfigTest, FillsDocumentedDefaults) {
  auto c = MakeJobConfig(Minimal(), JobLimits());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->plan.samples_per_epoch, 100u);
  EXPECT_EQ(c->plan.order, SampleOrder::kWeightedRandom);
  EXPECT_EQ(c->shard.partition, PartitionMode::kInterleaved);
  EXPECT_EQ(c->shard.uneven, UnevenMode::kPad);
  EXPECT_EQ(c->policy.base, BaseWeightKind::kUniform);
  EXPECT_EQ(c->policy.loss, LossWeightKind::kNone);
  EXPECT_DOUBLE_EQ(c->policy.ema_decay, 0.9);
  EXPECT_DOUBLE_EQ(c->policy.clamp_hi, 10.0);
  EXPECT_EQ(c->normalized.samples_per_epoch(), 100u);
  EXPECT_EQ(c->normalized.uneven(), v1::PAD);
}

TEST(JobConfigTest, SpelledOutDefaultsNormaliseToTheSameSpec) {
  v1::JobSpec explicit_spec = Minimal();
  explicit_spec.set_samples_per_epoch(100);
  explicit_spec.set_partition(v1::INTERLEAVED);
  explicit_spec.mutable_policy()->set_ema_decay(0.9);
  auto a = MakeJobConfig(Minimal(), JobLimits());
  auto b = MakeJobConfig(explicit_spec, JobLimits());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->normalized.SerializeAsString(), b->normalized.SerializeAsString());
}

TEST(JobConfigTest, RejectsBadSpecsNamingFieldAndValue) {
  struct Case {
    void (*mutate)(v1::JobSpec*);
    absl::StatusCode code;
    std::string want;
  } cases[] = {
      {[](v1::JobSpec* s) { s->set_num_samples(0); }, absl::StatusCode::kInvalidArgument,
       "spec.num_samples = 0"},
      {[](v1::JobSpec* s) { s->set_num_samples(1000); }, absl::StatusCode::kResourceExhausted,
       "spec.num_samples = 1000"},
      {[](v1::JobSpec* s) { s->set_world_size(0); }, absl::StatusCode::kInvalidArgument,
       "spec.world_size = 0"},
      {[](v1::JobSpec* s) { s->set_samples_per_epoch(101); }, absl::StatusCode::kInvalidArgument,
       "spec.samples_per_epoch = 101"},
      {[](v1::JobSpec* s) {
         s->set_order(v1::SEQUENTIAL);
         s->set_replacement(true);
       },
       absl::StatusCode::kInvalidArgument, "SEQUENTIAL"},
      {[](v1::JobSpec* s) {
         s->set_order(v1::SEQUENTIAL);
         s->mutable_policy()->set_loss(v1::LOSS);
       },
       absl::StatusCode::kInvalidArgument, "takes no weights"},
      {[](v1::JobSpec* s) { s->mutable_policy()->set_mix(2); }, absl::StatusCode::kInvalidArgument,
       "spec.policy.mix = 2"},
      {[](v1::JobSpec* s) { s->mutable_policy()->set_prior_loss(-1); },
       absl::StatusCode::kInvalidArgument, "policy.prior_loss = -1"},
      {[](v1::JobSpec* s) {  // A uniform base: no groups.
         s->mutable_policy()->set_loss(v1::LOSS);
         s->mutable_policy()->set_loss_within_groups(true);
       },
       absl::StatusCode::kInvalidArgument, "spec.policy.loss_within_groups = true needs"},
      {[](v1::JobSpec* s) {
         s->mutable_policy()->set_base(v1::CLASS_BALANCED);
         s->mutable_policy()->set_loss(v1::MULTIPLICATIVE);
         s->mutable_policy()->set_loss_within_groups(true);
       },
       absl::StatusCode::kInvalidArgument, "spec.policy.loss_within_groups = true needs"},
      {[](v1::JobSpec* s) {
         s->mutable_policy()->set_loss(v1::LOSS);
         s->mutable_policy()->set_min_effective_fraction(2);
       },
       absl::StatusCode::kInvalidArgument,
       "spec.policy.min_effective_fraction = 2 is outside [0, 1]"},
      {[](v1::JobSpec* s) {
         s->mutable_policy()->set_loss(v1::MULTIPLICATIVE);
         s->mutable_policy()->set_min_effective_fraction(0.5);
       },
       absl::StatusCode::kInvalidArgument,
       "spec.policy.min_effective_fraction = 0.5 needs loss = LOSS or REDUCIBLE_LOSS"},
  };
  JobLimits limits;
  limits.max_samples_per_job = 500;
  for (const Case& c : cases) {
    v1::JobSpec spec = Minimal();
    c.mutate(&spec);
    auto config = MakeJobConfig(spec, limits);
    EXPECT_EQ(config.status().code(), c.code) << c.want;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.want));
  }
}

TEST(JobConfigTest, ReducibleLossMapsToItsKindWithTheFloor) {
  v1::JobSpec spec = Minimal();
  spec.mutable_policy()->set_loss(v1::REDUCIBLE_LOSS);
  spec.mutable_policy()->set_base(v1::CLASS_BALANCED);
  spec.mutable_policy()->set_loss_within_groups(true);
  spec.mutable_policy()->set_min_effective_fraction(0.25);
  JobLimits limits;
  limits.max_samples_per_job = 500;
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy.loss, LossWeightKind::kReducibleLoss);
  EXPECT_EQ(config->policy.min_effective_fraction, 0.25);
  EXPECT_TRUE(config->policy.loss_within_groups);
  EXPECT_EQ(config->normalized.policy().loss(), v1::REDUCIBLE_LOSS);
  EXPECT_EQ(config->normalized.policy().min_effective_fraction(), 0.25);
}

TEST(JobConfigTest, RejectsAShuffleBeyondItsLimitAtCreation) {
  // 2^34 + 1 samples without replacement: refused when the job is made, not at its first plan.
  JobLimits limits;
  limits.max_samples_per_job = uint64_t{1} << 36;
  v1::JobSpec spec = Minimal();
  spec.set_num_samples((uint64_t{1} << 34) + 1);
  auto config = MakeJobConfig(spec, limits);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("spec.samples_per_epoch = 17179869185 without replacement: must be <= "
                        "17179869184"));
  spec.set_replacement(true);  // Draws with replacement are not shuffled: no limit.
  EXPECT_TRUE(MakeJobConfig(spec, limits).ok());
}

// Samples per epoch of a job that is not a mixture job: at most 16 x --max_samples_per_job, the
// limit named; a flag over 2^60 does not overflow it.
TEST(JobConfigTest, SamplesPerEpochLimitIsNamedAndSaturates) {
  JobLimits limits;
  limits.max_samples_per_job = 500;
  v1::JobSpec spec = Minimal();
  spec.set_replacement(true);
  spec.set_samples_per_epoch(8000);
  EXPECT_TRUE(MakeJobConfig(spec, limits).ok());
  spec.set_samples_per_epoch(8001);
  absl::StatusOr<JobConfig> config = MakeJobConfig(spec, limits);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("spec.samples_per_epoch = 8001: must be <= 8000 (16 x "
                        "--max_samples_per_job)"));
  limits.max_samples_per_job = (uint64_t{1} << 62) + 1;  // x 16 wraps to 16.
  spec.set_samples_per_epoch(uint64_t{1} << 40);
  config = MakeJobConfig(spec, limits);
  EXPECT_TRUE(config.ok()) << config.status();
}

TEST(JobConfigTest, JobNames) {
  EXPECT_TRUE(ValidateJobName("train-1.v2_x").ok());
  EXPECT_THAT(std::string(ValidateJobName("").message()), HasSubstr("1 to 128"));
  EXPECT_THAT(std::string(ValidateJobName(std::string(129, 'a')).message()), HasSubstr("1 to 128"));
  EXPECT_THAT(std::string(ValidateJobName("a/b").message()), HasSubstr("name = \"a/b\""));
  EXPECT_THAT(std::string(ValidateJobName("..").message()), HasSubstr("not a valid job name"));
  EXPECT_TRUE(ValidateJobName("..x").ok());
}

}  // namespace
}  // namespace samplerd
