// The one translation of a loss policy (WeightPolicyParams, validated) into the device kernels'
// RecomputeParams (device_weights.h, which cannot include the Abseil-based weight_policy.h: the
// GPU machine's nvcc build has no Abseil). Used by the CUDA backend and by the reference test
// that checks the device definition against the CPU backend's.
#ifndef SAMPLERD_KERNELS_CUDA_RECOMPUTE_PARAMS_H_
#define SAMPLERD_KERNELS_CUDA_RECOMPUTE_PARAMS_H_

#include <cstdint>

#include "kernels/cuda/device_weights.h"
#include "kernels/loss_stats.h"
#include "kernels/weight_policy.h"

namespace samplerd {
namespace gpu {

// `policy`'s loss kind and parameters, and the marker of `closed_epoch` (EpochMarker). For a
// loss policy only (UsesLossStats). A per-sample input of the policy's rule (REDUCIBLE_LOSS's
// irreducible losses) and the groups' table are the caller's to set: they live in device memory
// for the kernels, host memory for the reference.
inline RecomputeParams DeviceRecomputeParams(const WeightPolicyParams& policy,
                                             uint64_t closed_epoch) {
  RecomputeParams p;
  p.loss = policy.loss;
  p.alpha = policy.alpha;
  p.epsilon = policy.epsilon;
  p.mix = policy.mix;
  p.has_prior_loss = policy.prior_loss.has_value();
  p.prior_loss = policy.prior_loss.value_or(0.0);
  p.eta = policy.eta;
  p.clamp_lo = policy.clamp_lo;
  p.clamp_hi = policy.clamp_hi;
  p.marker = EpochMarker(closed_epoch);
  p.within_groups = policy.loss_within_groups;  // The caller sets the groups' table.
  p.min_effective_fraction = policy.min_effective_fraction;
  return p;
}

}  // namespace gpu
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_CUDA_RECOMPUTE_PARAMS_H_
