// The CPU backend's pass of the LOSS policy with loss_within_groups (docs/SAMPLING.md, "Loss
// within groups"): every sample's loss factor normalised within its group, written to out[i],
// ready for the LOSS policy's clamp and result passes with mean_f = 1.
//
// Group maxima and sums are integer maxima and integer sums, so the result does not depend on
// the thread count or the split. Thread-safe (pure, writing only arrays.out).
#ifndef SAMPLERD_KERNELS_INTERNAL_GROUP_FACTORS_H_
#define SAMPLERD_KERNELS_INTERNAL_GROUP_FACTORS_H_

#include <cstdint>

#include "kernels/internal/recompute_passes.h"
#include "kernels/loss_groups.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace internal {

// out[i] = weight_math::GroupNormalisedFactor(f_i, mean_g) for i in [0, n): f_i is LossFactor
// of the Signal of the kFactor rule of `rule.kind` (policy_rules.h; nothing for other kinds)
// with the group's factor rule (GroupFactorRule: `global` with x_max the largest x_i of the group),
// mean_g the group's GroupFactorMean. arrays.base is required (the groups' keys); arrays.stats
// validated (the recompute's first pass).
void GroupFactors(int threads, const RecomputeArrays& arrays, const RawWeightRule& rule,
                  const weight_math::LossFactorRule& global, const LossGroupTable& groups,
                  uint64_t n);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_GROUP_FACTORS_H_
