#include "server/job_config.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/loss_policies.h"
#include "kernels/plan_math.h"

namespace samplerd {
namespace {

// Proto default 0 means "unset": the documented default.
double OrDefault(double value, double default_value) { return value == 0 ? default_value : value; }

absl::Status ValidateWorldSize(const v1::JobSpec& spec) {
  if (spec.world_size() == 0)
    return absl::InvalidArgumentError("spec.world_size = 0: must be >= 1");
  if (spec.world_size() > static_cast<uint32_t>(v1::MAX_WORLD_SIZE)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.world_size = ", spec.world_size(), ": must be <= ", v1::MAX_WORLD_SIZE));
  }
  return absl::OkStatus();
}

// A job that is not a mixture job draws at most 16 x --max_samples_per_job samples per epoch
// (saturating: any flag value is a limit). Mixture jobs have their own bound (job_config.h).
absl::Status CheckSamplesPerEpoch(uint64_t m, const JobLimits& limits) {
  constexpr uint64_t kFactor = 16;
  const uint64_t most = limits.max_samples_per_job > std::numeric_limits<uint64_t>::max() / kFactor
                            ? std::numeric_limits<uint64_t>::max()
                            : limits.max_samples_per_job * kFactor;
  if (m <= most) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("spec.samples_per_epoch = ", m, ": must be <= ",
                                                 most, " (", kFactor,
                                                 " x --max_samples_per_job)"));
}

// INVALID_ARGUMENT with every enum field's number if one holds a value this server does not
// know (a newer client's): any job's spec.
absl::Status CheckEnums(const v1::JobSpec& spec) {
  if (v1::Order_IsValid(spec.order()) && v1::Partition_IsValid(spec.partition()) &&
      v1::UnevenPolicy_IsValid(spec.uneven()) && v1::BasePolicy_IsValid(spec.policy().base()) &&
      v1::LossPolicy_IsValid(spec.policy().loss())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec: unknown enum value (order = ", spec.order(), ", partition = ", spec.partition(),
      ", uneven = ", spec.uneven(), ", policy.base = ", spec.policy().base(),
      ", policy.loss = ", spec.policy().loss(), ")"));
}

// The shard geometry of `spec` into `shard`; returns the partition and uneven policy with their
// defaults filled in.
std::pair<v1::Partition, v1::UnevenPolicy> FillShard(const v1::JobSpec& spec, ShardSpec* shard) {
  const v1::Partition partition =
      spec.partition() == v1::PARTITION_UNSPECIFIED ? v1::INTERLEAVED : spec.partition();
  const v1::UnevenPolicy uneven =
      spec.uneven() == v1::UNEVEN_POLICY_UNSPECIFIED ? v1::PAD : spec.uneven();
  shard->world_size = spec.world_size();
  shard->partition =
      partition == v1::CONTIGUOUS ? PartitionMode::kContiguous : PartitionMode::kInterleaved;
  shard->uneven = uneven == v1::DROP_LAST ? UnevenMode::kDropLast
                  : uneven == v1::UNEVEN  ? UnevenMode::kUneven
                                          : UnevenMode::kPad;
  return {partition, uneven};
}

// A mixture job (spec.mixture set): see job_config.h.
absl::StatusOr<JobConfig> MakeMixtureJobConfig(const v1::JobSpec& spec, const JobLimits& limits) {
  JobConfig c;
  c.rewind_epochs = limits.rewind_epochs;
  absl::StatusOr<std::shared_ptr<const MixtureConfig>> mixture =
      MakeMixtureConfig(spec.mixture(), spec.num_samples());
  if (!mixture.ok()) return mixture.status();
  c.mixture = *std::move(mixture);
  const uint64_t n = c.mixture->layout.total();
  if (absl::Status s = ValidateWorldSize(spec); !s.ok()) return s;
  const uint64_t m = spec.samples_per_epoch();
  if (m == 0 || m > plan_math::kMaxShuffleInputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.samples_per_epoch = ", m, ": a mixture job's window holds 1 to ",
                     plan_math::kMaxShuffleInputs, " samples (the shuffle's limit); give it"));
  }
  // Every enum known, so the refusals below can name the values.
  if (absl::Status s = CheckEnums(spec); !s.ok()) return s;
  // The window is the plan: no other draw, no per-sample weights.
  if (spec.replacement()) {
    return absl::InvalidArgumentError(
        "spec.replacement = true: a mixture job's windows take each group's samples in its pass "
        "order (a group smaller than the window repeats in its next pass); leave it false");
  }
  if (spec.order() != v1::ORDER_UNSPECIFIED && spec.order() != v1::WEIGHTED_RANDOM) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.order = ", v1::Order_Name(spec.order()),
        ": a mixture job's order is its shuffled window; leave it unset (WEIGHTED_RANDOM)"));
  }
  // Any per-sample policy: the group weights choose the mixture.
  v1::WeightPolicy rest = spec.policy();
  if (rest.base() == v1::UNIFORM) rest.clear_base();
  if (rest.loss() == v1::NONE) rest.clear_loss();
  if (rest.ByteSizeLong() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.policy = {", spec.policy().ShortDebugString(),
                     "}: a mixture job takes no per-sample weight policy; its group weights are "
                     "spec.mixture.group_weights (leave spec.policy unset)"));
  }
  c.plan = PlanSpec{n, m, spec.seed(), /*replacement=*/false, SampleOrder::kWeightedRandom};
  const auto [partition, uneven] = FillShard(spec, &c.shard);
  c.policy.base = BaseWeightKind::kUniform;
  c.policy.loss = LossWeightKind::kNone;

  v1::JobSpec& out = c.normalized;
  out = spec;
  out.set_num_samples(n);
  out.set_order(v1::WEIGHTED_RANDOM);
  out.set_partition(partition);
  out.set_uneven(uneven);
  out.clear_policy();
  out.mutable_policy()->set_base(v1::UNIFORM);
  out.mutable_policy()->set_loss(v1::NONE);
  return c;
}

}  // namespace

absl::Status ValidateJobName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("name = \"", name.substr(0, 140), "\": must be 1 to 128 characters"));
  }
  if (name == "." || name == "..") {  // Names are directory names under --data_dir.
    return absl::InvalidArgumentError(absl::StrCat("name = \"", name, "\": not a valid job name"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("name = \"", name, "\": only [A-Za-z0-9._-] are allowed"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> MakeJobConfig(const v1::JobSpec& spec, const JobLimits& limits) {
  JobConfig c;
  c.rewind_epochs = limits.rewind_epochs;
  if (spec.has_mixture()) return MakeMixtureJobConfig(spec, limits);
  const uint64_t n = spec.num_samples();
  if (n == 0) return absl::InvalidArgumentError("spec.num_samples = 0: must be >= 1");
  if (n > limits.max_samples_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat("spec.num_samples = ", n, " exceeds the server limit ",
                     limits.max_samples_per_job, " (--max_samples_per_job)"));
  }
  if (absl::Status s = ValidateWorldSize(spec); !s.ok()) return s;
  const uint64_t m = spec.samples_per_epoch() == 0 ? n : spec.samples_per_epoch();
  if (absl::Status s = CheckSamplesPerEpoch(m, limits); !s.ok()) return s;
  if (absl::Status s = CheckEnums(spec); !s.ok()) return s;
  const v1::Order order =
      spec.order() == v1::ORDER_UNSPECIFIED ? v1::WEIGHTED_RANDOM : spec.order();
  c.plan =
      PlanSpec{n, m, spec.seed(), spec.replacement(),
               order == v1::SEQUENTIAL ? SampleOrder::kSequential : SampleOrder::kWeightedRandom};
  // The plan's own rules (M <= N without replacement, the shuffle's limit, SEQUENTIAL), named
  // as fields of the spec.
  if (absl::Status s = ValidatePlanSpec(c.plan); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }

  const auto [partition, uneven] = FillShard(spec, &c.shard);

  const v1::WeightPolicy& p = spec.policy();
  const v1::BasePolicy base = p.base() == v1::BASE_POLICY_UNSPECIFIED ? v1::UNIFORM : p.base();
  const v1::LossPolicy loss = p.loss() == v1::LOSS_POLICY_UNSPECIFIED ? v1::NONE : p.loss();
  if (order == v1::SEQUENTIAL && (base != v1::UNIFORM || loss != v1::NONE)) {
    return absl::InvalidArgumentError(
        "spec.policy: order = SEQUENTIAL takes no weights; use base = UNIFORM, loss = NONE");
  }
  WeightPolicyParams& w = c.policy;
  w.base = base == v1::STATIC           ? BaseWeightKind::kStatic
           : base == v1::CLASS_BALANCED ? BaseWeightKind::kClassBalanced
                                        : BaseWeightKind::kUniform;
  // The policy's descriptor (kernels/loss_policies.h) names its proto value.
  if (!LossKindNamed(v1::LossPolicy_Name(loss).c_str(), &w.loss)) {
    return absl::InvalidArgumentError(absl::StrCat("spec.policy.loss = ", v1::LossPolicy_Name(loss),
                                                   " is not supported by this server"));
  }
  w.class_balance_beta = p.class_balance_beta();
  w.ema_decay = OrDefault(p.ema_decay(), 0.9);
  w.alpha = OrDefault(p.alpha(), 1.0);
  w.epsilon = OrDefault(p.epsilon(), 1e-3);
  w.mix = p.mix();
  w.clamp_lo = OrDefault(p.clamp_lo(), 0.1);
  w.clamp_hi = OrDefault(p.clamp_hi(), 10.0);
  if (p.has_prior_loss()) w.prior_loss = p.prior_loss();
  w.eta = OrDefault(p.eta(), 1.0);
  w.loss_within_groups = p.loss_within_groups();
  w.min_effective_fraction = p.min_effective_fraction();
  if (absl::Status s = ValidatePolicy(w); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }

  v1::JobSpec& out = c.normalized;
  out = spec;
  out.set_samples_per_epoch(m);
  out.set_order(order);
  out.set_partition(partition);
  out.set_uneven(uneven);
  v1::WeightPolicy* op = out.mutable_policy();
  op->set_base(base);
  op->set_loss(loss);
  op->set_ema_decay(w.ema_decay);
  op->set_alpha(w.alpha);
  op->set_epsilon(w.epsilon);
  op->set_clamp_lo(w.clamp_lo);
  op->set_clamp_hi(w.clamp_hi);
  op->set_eta(w.eta);
  return c;
}

}  // namespace samplerd
