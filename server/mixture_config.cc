#include "server/mixture_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/mixture/apportion.h"
#include "kernels/mixture/group_weights.h"

namespace samplerd {
namespace {

// The kernels' errors name `sizes[k]`, `weights[k]`, `reference_losses[k]`: as fields of the
// spec.
absl::Status InSpec(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// The rule of spec.mixture.rule with spec.mixture.online's parameters (unset: the defaults of
// group_weights.h) from the given `weights` (checked already). The kernels' errors name `eta`, `smoothing`,
// ..., `bounds.min_ratio`: as fields of spec.mixture.online.
absl::StatusOr<mixture::GroupWeights> MakeRule(const v1::MixtureSpec& spec,
                                               const std::vector<double>& weights,
                                               const std::vector<double>& reference) {
  const v1::OnlineWeights& o = spec.online();
  auto online_error = [](const absl::Status& s) {
    absl::string_view message = s.message();
    absl::ConsumePrefix(&message, "bounds.");
    return absl::Status(s.code(), absl::StrCat("spec.mixture.online.", message));
  };
  mixture::WeightBounds bounds;
  if (o.has_min_ratio()) bounds.min_ratio = o.min_ratio();
  if (o.has_max_ratio()) bounds.max_ratio = o.max_ratio();
  switch (spec.rule()) {
    case v1::STATIC_WEIGHTS:
      return mixture::GroupWeights::Static(weights);
    case v1::EXCESS_LOSS: {
      if (reference.empty()) {
        return absl::InvalidArgumentError(
            "spec.mixture.reference_losses: empty; rule = EXCESS_LOSS needs one reference loss "
            "per group (e.g. each group's loss under a model trained on the uniform mixture)");
      }
      mixture::ExcessLossConfig c;
      if (o.has_eta()) c.eta = o.eta();
      if (o.has_smoothing()) c.smoothing = o.smoothing();
      if (o.has_loss_decay()) c.loss_decay = o.loss_decay();
      if (o.has_horizon()) c.horizon = o.horizon();
      c.bounds = bounds;
      absl::StatusOr<mixture::GroupWeights> made =
          mixture::GroupWeights::ExcessLoss(weights, reference, c);
      if (!made.ok()) return online_error(made.status());
      return made;
    }
    case v1::EXP3: {
      mixture::Exp3Config c;
      if (o.has_eta()) c.eta = o.eta();
      if (o.has_exploration()) c.exploration = o.exploration();
      if (o.has_reward_decay()) c.reward_decay = o.reward_decay();
      if (o.has_loss_decay()) c.loss_decay = o.loss_decay();
      c.bounds = bounds;
      absl::StatusOr<mixture::GroupWeights> made = mixture::GroupWeights::Exp3(weights, c);
      if (!made.ok()) return online_error(made.status());
      return made;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.mixture.rule = ", spec.rule(),
                       ": not a GroupWeightRule (STATIC_WEIGHTS, EXCESS_LOSS or EXP3)"));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MixtureConfig>> MakeMixtureConfig(const v1::MixtureSpec& spec,
                                                                       uint64_t num_samples) {
  const std::vector<uint64_t> sizes(spec.group_sizes().begin(), spec.group_sizes().end());
  absl::StatusOr<mixture::GroupLayout> layout = mixture::GroupLayout::Create(sizes);
  if (!layout.ok()) return InSpec("spec.mixture.group_", layout.status());
  if (num_samples != 0 && num_samples != layout->total()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.num_samples = ", num_samples, ": the ", layout->groups(),
                     " groups of spec.mixture.group_sizes hold ", layout->total(),
                     " samples (give their sum, or 0)"));
  }
  const uint64_t k_groups = layout->groups();
  std::vector<double> given(spec.group_weights().begin(), spec.group_weights().end());
  if (given.empty()) {  // Proportional to the sizes: every sample equally likely.
    given.assign(sizes.begin(), sizes.end());
  }
  absl::StatusOr<std::vector<double>> weights = mixture::NormalizeWeights(given, k_groups);
  if (!weights.ok()) return InSpec("spec.mixture.group_", weights.status());
  std::vector<double> reference(spec.reference_losses().begin(), spec.reference_losses().end());
  if (!reference.empty()) {
    if (absl::Status s = mixture::ValidateReferenceLosses(reference, k_groups); !s.ok()) {
      return InSpec("spec.mixture.", s);
    }
  }
  // From the given weights (normalised once, as NormalizeWeights did: the same bits).
  absl::StatusOr<mixture::GroupWeights> rule = MakeRule(spec, given, reference);
  if (!rule.ok()) return rule.status();
  // Epoch 0's weights: an online rule's are projected onto its bounds.
  *weights = rule->weights();
  absl::StatusOr<std::vector<uint64_t>> shares = mixture::SharesOf(*weights);
  if (!shares.ok()) return InSpec("spec.mixture.group_", shares.status());
  auto config = std::make_shared<MixtureConfig>(MixtureConfig{*std::move(layout)});
  config->weights = *std::move(weights);
  config->shares = *std::move(shares);
  config->reference_losses = std::move(reference);
  config->rule = rule->rule();
  config->initial = std::make_shared<const mixture::GroupWeights>(*std::move(rule));
  return std::shared_ptr<const MixtureConfig>(std::move(config));
}

}  // namespace samplerd
