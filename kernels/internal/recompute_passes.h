// The passes of CpuBackend::RecomputeWeights (kernels/cpu_backend.cc), vectorised where the
// CPU allows.
//
// The weights are defined (docs/SAMPLING.md; ReferenceRecompute in cpu_backend_test.cc is the
// executable version) by IEEE operations in double on each sample (kernels/weight_math.h: the
// per-sample rules, shared with the CUDA kernels), and by exact sums
// (kernels/exact_sum.h) over chunks of exact_sum::kChunk samples. So the vector lanes here
// compute each sample's term (the same operations in the same order, no FMA:
// -ffp-contract=off), and each chunk's sum is an integer sum of the quantised terms: every
// SimdLevel, and every order of addition, returns the same bits as the scalar definition.
//
// The summing passes work on a group of consecutive chunks, [begin, end) with begin a multiple
// of kSumChunk, and return one exact_sum::ChunkSum per chunk. RecomputeWeights runs the groups
// in parallel; the results do not depend on the thread count.
//
// Samples: base and current weights (nullptr: all 1) and the loss statistics; `out` may alias
// `current` (a pass that writes out[i] reads current[i] before). Thread-safe (pure) for disjoint
// ranges of `out`.
#ifndef SAMPLERD_KERNELS_INTERNAL_RECOMPUTE_PASSES_H_
#define SAMPLERD_KERNELS_INTERNAL_RECOMPUTE_PASSES_H_

#include <cstdint>

#include "kernels/exact_sum.h"
#include "kernels/internal/simd_level.h"
#include "kernels/loss_stats.h"
#include "kernels/policy_rules.h"
#include "kernels/weight_math.h"
#include "kernels/weight_policy.h"

namespace samplerd {
namespace internal {

struct RecomputeArrays {
  const float* base = nullptr;     // N base weights, or nullptr: all 1.
  const float* current = nullptr;  // N current weights W_e, or nullptr: all 1.
  const SampleLossStats* stats = nullptr;
  float* out = nullptr;
  // REDUCIBLE_LOSS: the N irreducible losses (finite, >= 0), which its rule reads
  // (policy_rules.h: PolicyRuleInputs); nullptr for every other policy.
  const float* irreducible = nullptr;
};

// The policy's rule and what its passes have found so far. The passes are templates over the
// rule of `kind` (kernels/policy_rules.h: VisitPolicyRule chooses it) and its shape; the raw
// weight of a sample (the terms of the first normalisation; weight_math.h's arithmetic):
//   kFactor rules (LOSS, REDUCIBLE_LOSS): raw_i = base_i ((1 - mix) f_i / mean_f + mix), f_i
//                    read from out[i] (LossFactorsChunks wrote it, the loss factor of the rule's
//                    Signal); excluded (weight exactly 0): base_i == 0. Their mean is
//                    weight_math::LossRawMean, from the factor pass's sums.
//   kDirect rules (MULTIPLICATIVE): raw_i = the rule's Raw(current_i, ema_i, last_epoch_i);
//                    excluded: current_i == 0.
struct RawWeightRule {
  LossWeightKind kind = LossWeightKind::kNone;
  double mix = 0, mean_f = 1;  // kFactor.
  double eta = 1;              // The rule's inputs (PolicyRuleInputs): MULTIPLICATIVE's eta
  uint16_t marker = 0;         // and EpochMarker(closed epoch).
};

// The inputs of the rule of `rule.kind` (VisitPolicyRule) from the arrays and `rule`.
inline PolicyRuleInputs RuleInputsOf(const RecomputeArrays& arrays, const RawWeightRule& rule) {
  PolicyRuleInputs inputs;
  inputs.irreducible = arrays.irreducible;
  inputs.eta = rule.eta;
  inputs.marker = rule.marker;
  return inputs;
}

constexpr uint64_t kNoSample = ~uint64_t{0};

// What the first pass finds in a chunk: validation, and what the next passes need.
struct ChunkScan {
  // The lowest index with a bad entry: a base or current weight not finite or < 0, or the EMA
  // of a sample with count > 0 or last_epoch > 0 not finite or < 0. When set, the fields below
  // are unspecified.
  uint64_t first_bad = kNoSample;
  bool base_positive = false;     // Some base weight > 0 (false when base is nullptr).
  bool current_positive = false;  // Some current weight > 0 (false when current is nullptr).
  // kFactor rules: the samples with count > 0 ("seen"): how many, the sum of their signals
  // (the rule's Signal: the EMA for LOSS) and the largest signal (0 if none); whether any sample
  // is unseen; with base weights, the sum of base_i (for weight_math::LossRawMean). The fields
  // keep the EMA's name.
  uint64_t seen = 0;
  exact_sum::ChunkSum ema_sum;  // Of the seen samples' EMAs.
  float ema_max = 0;
  bool unseen = false;
  exact_sum::ChunkSum base_sum;
  // kDirect rules: the sum of raw_i.
  exact_sum::ChunkSum raw_sum;
};

// Samples per chunk of every sum (part of the definition of the weights: exact_sum.h), and
// chunks per group (a parallel task: 64 Ki samples).
constexpr uint64_t kSumChunk = exact_sum::kChunk;
constexpr uint64_t kChunksPerGroup = 16;

// Validates the group [begin, end) and gathers what the rule of `rule.kind` needs: scans[c] for
// each of its chunks. Writes nothing to arrays.out.
void ScanChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                uint64_t begin, uint64_t end, ChunkScan* scans);

// The loss factors of a kFactor rule (`rule.kind`; nothing for the others),
// weight_math::LossFactor (f_i = (x_i / x_max)^alpha) of the rule's Signal, written to out[i] as
// floats; sums[c] = the exact sum of the floats (as doubles) of chunk c,
// and, with base weights, base_factor_sums[c] = the exact sum of weight_math::BaseFactorTerm
// (base_i f_i) of chunk c (base_factor_sums is not written without base weights).
using LossFactorParams = weight_math::LossFactorRule;
void LossFactorsChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                       const LossFactorParams& params, uint64_t begin, uint64_t end,
                       exact_sum::ChunkSum* sums, exact_sum::ChunkSum* base_factor_sums);

// The clamp between the two normalisations, weight_math::Clamped: c_i = 0 for an excluded
// sample, else std::clamp(mean > 0 ? raw_i / mean : 1.0, lo, hi), with `mean` the mean raw
// weight.
using ClampRule = weight_math::ClampRule;

// sums[c] = the exact sum of c_i over chunk c.
void SumClampedChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                      const ClampRule& clamp, uint64_t begin, uint64_t end,
                      exact_sum::ChunkSum* sums);

// For the effective sample size floor: sums[c] and square_sums[c] = the exact sums over chunk c
// of w_i = float(c_i / mean_clamped) (as doubles) and of weight_math::SquareTerm(w_i): the
// S1 and S2 of the weights WriteWeightsRange would write. Writes nothing.
void SumFinalChunks(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                    const ClampRule& clamp, double mean_clamped, uint64_t begin, uint64_t end,
                    exact_sum::ChunkSum* sums, exact_sum::ChunkSum* square_sums);

// out[i] = float(c_i / mean_clamped) for i in [begin, end) (any range).
void WriteWeightsRange(SimdLevel level, const RecomputeArrays& arrays, const RawWeightRule& rule,
                       const ClampRule& clamp, double mean_clamped, uint64_t begin, uint64_t end);

}  // namespace internal
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_INTERNAL_RECOMPUTE_PASSES_H_
