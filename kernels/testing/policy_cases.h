// The weight policies of the recompute tests that several backends' tests share: a golden
// case's (weight_cases.h) and the randomised rounds'. Separate from weight_cases.h, which stays
// Abseil-free for the GPU machine's nvcc build (WeightPolicyParams is not).
#ifndef SAMPLERD_KERNELS_TESTING_POLICY_CASES_H_
#define SAMPLERD_KERNELS_TESTING_POLICY_CASES_H_

#include <functional>

#include "kernels/testing/weight_cases.h"
#include "kernels/weight_policy.h"

namespace samplerd {
namespace testutil {

// The policy of golden case `g` (its loss kind and parameters; the base weights are inputs).
inline WeightPolicyParams GoldenPolicy(const RecomputeGolden& g) {
  WeightPolicyParams p;
  p.loss = static_cast<LossWeightKind>(g.kind);
  p.alpha = g.alpha;
  p.mix = g.mix;
  p.clamp_lo = g.clamp_lo;
  p.clamp_hi = g.clamp_hi;
  p.eta = g.eta;
  p.prior_loss = g.prior;
  return p;
}

// A valid loss policy for round `round` of a randomised recompute test: the loss policy or the
// multiplicative one by round, and every parameter spread over its range by `next` (uniform in
// [0, 1), called a fixed number of times per round), the prior set in some rounds.
inline WeightPolicyParams RandomLossPolicy(int round, const std::function<double()>& next) {
  WeightPolicyParams p;
  p.loss = round % 3 == 2 ? LossWeightKind::kMultiplicative : LossWeightKind::kLoss;
  const double alphas[] = {1.0, 0.0, 0.5, 2.0, 8.0, 0.3};
  p.alpha = alphas[round % 6];
  p.epsilon = round % 4 == 0 ? 1e-3 : 1e-6 + next();
  p.mix = round % 5 == 0 ? 0.0 : next();
  p.clamp_lo = 0.01 + 0.99 * next();
  p.clamp_hi = 1.0 + 20 * next();
  p.eta = 0.01 + 10 * next();
  if (round % 7 == 3) p.prior_loss = next();
  return p;
}

}  // namespace testutil
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_TESTING_POLICY_CASES_H_
