// MixtureConfig: a mixture job's groups and static weights (proto MixtureSpec), validated once
// at job creation (MakeJobConfig) and immutable afterwards: the layout of the groups, their
// weights and the shares of a window that the apportionment reads (docs/SAMPLING.md, "Mixture
// jobs"). O(K) memory; nothing per sample. Pure functions; thread-safe (immutable).
#ifndef SAMPLERD_SERVER_MIXTURE_CONFIG_H_
#define SAMPLERD_SERVER_MIXTURE_CONFIG_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mixture/group_weights.h"
#include "kernels/mixture/window.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

struct MixtureConfig {
  mixture::GroupLayout layout;
  // Epoch 0's weights: w_k / sum w (kernels/mixture/group_weights.h's NormalizeWeights of the
  // spec's weights, or of the sizes when the spec gives none), projected onto the bounds of an
  // online rule.
  std::vector<double> weights;
  // SharesOf(weights) (kernels/mixture/apportion.h): epoch 0's shares of D = 2^63.
  std::vector<uint64_t> shares;
  // Empty, or one per group (finite, >= 0): the online excess-loss rule's reference.
  std::vector<double> reference_losses;
  // How the weights move (spec.mixture.rule), and the rule with its parameters at epoch 0 (its
  // weights are `weights` projected onto the bounds for an online rule; no group seen yet): the
  // object each epoch's weights are restored into (GroupWeights::Restore) and updated by.
  mixture::GroupWeightRule rule = mixture::GroupWeightRule::kStatic;
  std::shared_ptr<const mixture::GroupWeights> initial;

  bool online() const { return rule != mixture::GroupWeightRule::kStatic; }

  // The memory these arrays hold: 16 bytes per group for the layout, 8 each for the weights,
  // the shares and the reference losses; the initial rule's weights, tracks and reference
  // (48 more).
  uint64_t Bytes() const { return layout.groups() * uint64_t{88}; }
};

// Validates `spec` (a JobSpec's mixture) for a job of `num_samples` (0: the sum of the sizes).
// INVALID_ARGUMENT naming the field, the group and the value: spec.mixture.group_sizes (no
// group, more than kMaxGroups, a size of 0, a sum over 2^63), spec.num_samples (not the sum of
// the sizes), spec.mixture.group_weights (not one per group, negative, NaN, infinite, all 0),
// spec.mixture.reference_losses (not one per group, negative, NaN, infinite; empty with
// EXCESS_LOSS), spec.mixture.rule (not a GroupWeightRule), spec.mixture.online.<field> (out of
// its range: group_weights.h's checks).
absl::StatusOr<std::shared_ptr<const MixtureConfig>> MakeMixtureConfig(const v1::MixtureSpec& spec,
                                                                       uint64_t num_samples);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_MIXTURE_CONFIG_H_
