// The loss policies' descriptors: one entry per policy (LossWeightKind), the one home of what
// the server, the memory estimate, the planner, the persistence and the backends ask about a
// policy ("does it keep loss statistics?", "which parameters does it read?", "how many bytes per
// sample does it add?", "which proto enum value is it?"). docs/CONTRIBUTING.md, "Adding a weight
// policy", lists the files a new policy touches, in order.
//
// The per-sample rule of a policy is not here: it is its rule type in kernels/policy_rules.h
// (host and device, with the LossWeightKind and the one dispatch VisitPolicyRule), which the CPU
// passes, the CUDA kernels and the CUDA reference all run; policy_rules_test checks that each
// descriptor's loss_factor and reads_current agree with its rule's shape. Its parameters and
// their validation are WeightPolicyParams and ValidatePolicy (weight_policy.h).
//
// Header-only, constexpr, free of Abseil and protobuf (the kernels do not depend on the proto):
// the proto mapping is by the enum value's name. Thread-safe (constant data).
#ifndef SAMPLERD_KERNELS_LOSS_POLICIES_H_
#define SAMPLERD_KERNELS_LOSS_POLICIES_H_

#include <cstdint>
#include <cstring>

#include "kernels/loss_stats.h"
#include "kernels/weight_policy.h"

namespace samplerd {

struct LossPolicyDescriptor {
  LossWeightKind kind;
  // The LossPolicy enum value's name in proto/samplerd.proto (job_config.cc maps by it).
  const char* proto_name;
  // Keeps per-sample loss statistics (SampleLossStats, 8 bytes per sample): ReportLosses is
  // applied, the epoch boundary recomputes W_{e+1}, snapshots and rewinds keep the statistics.
  bool uses_loss_stats;
  // The recompute reads the current weights W_e (MULTIPLICATIVE: W_{e+1} = W_e times a factor);
  // the others start from the base weights.
  bool reads_current;
  // policy.loss_within_groups is allowed (with a STATIC or CLASS_BALANCED base).
  bool allows_within_groups;
  // Per-sample bytes the policy holds besides the loss statistics and the weight vectors.
  uint64_t extra_bytes_per_sample;
  // The weight is LOSS's loss factor of a per-sample signal (weight_math.h: LossFactor of the
  // rule's Signal: a kFactor rule of policy_rules.h), with its mix, clamps and
  // effective-sample-size floor.
  bool loss_factor;
  // The policy reads per-sample irreducible losses (UploadIrreducibleLosses): the job has no plan
  // until they are uploaded.
  bool irreducible_losses;
};

inline constexpr LossPolicyDescriptor kLossPolicies[] = {
    {LossWeightKind::kNone, "NONE", /*uses_loss_stats=*/false, /*reads_current=*/false,
     /*allows_within_groups=*/false, /*extra_bytes_per_sample=*/0, /*loss_factor=*/false,
     /*irreducible_losses=*/false},
    {LossWeightKind::kLoss, "LOSS", true, false, true, 0, true, false},
    {LossWeightKind::kMultiplicative, "MULTIPLICATIVE", true, true, false, 0, false, false},
    // The irreducible losses: one float per sample.
    {LossWeightKind::kReducibleLoss, "REDUCIBLE_LOSS", true, false, true, sizeof(float), true,
     true},
};

// The descriptor of `kind` (every LossWeightKind has one).
inline const LossPolicyDescriptor& DescriptorOf(LossWeightKind kind) {
  for (const LossPolicyDescriptor& d : kLossPolicies) {
    if (d.kind == kind) return d;
  }
  return kLossPolicies[0];  // Not reached: every kind is in the table.
}

// Whether the policy keeps loss statistics (and so recomputes the weights at an epoch boundary).
inline bool UsesLossStats(const WeightPolicyParams& policy) {
  return DescriptorOf(policy.loss).uses_loss_stats;
}

// Whether the policy reads per-sample irreducible losses.
inline bool UsesIrreducibleLosses(const WeightPolicyParams& policy) {
  return DescriptorOf(policy.loss).irreducible_losses;
}

// The kind whose proto_name is `name` (a LossPolicy enum value's name); false if none.
inline bool LossKindNamed(const char* name, LossWeightKind* kind) {
  for (const LossPolicyDescriptor& d : kLossPolicies) {
    if (std::strcmp(d.proto_name, name) == 0) {
      *kind = d.kind;
      return true;
    }
  }
  return false;
}

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_LOSS_POLICIES_H_
