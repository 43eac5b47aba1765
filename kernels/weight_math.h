// The per-sample rules of the weight side of docs/SAMPLING.md ("Loss policies", "Summary"), as
// host + device functions: the validation of one sample, the loss factor f_i, the raw weight, the
// clamp, the final division, and the scalar steps between the passes (the prior and x_max; the
// summary's mean and effective sample size). One home for each: the CPU backend's passes
// (kernels/internal/recompute_passes.cc), the CUDA kernels (kernels/cuda/device_weights.cu) and
// the sequential reference (kernels/cuda/reference.cc) all call these.
//
// Every rule is IEEE +, -, *, / in double in a fixed order (no FMA: the CPU builds with
// -ffp-contract=off, nvcc with -fmad=false) and det_math.h's Log2/Exp2, so host and device
// return the same bits. Choices between two values are made on the bits (Select), so that the
// CPU's loops that call these vectorise: both values are computed whatever the condition.
//
// Header-only and free of library calls (Abseil, libm), so that nvcc compiles it for the device.
// Thread-safe (pure functions).
#ifndef SAMPLERD_KERNELS_WEIGHT_MATH_H_
#define SAMPLERD_KERNELS_WEIGHT_MATH_H_

#include <cstdint>
#include <cstring>

#include "kernels/det_math.h"
#include "kernels/loss_stats.h"

// Force-inlined on the host: the CPU's passes are compiled once per SIMD level, and an
// out-of-line copy would be compiled for the baseline level only (and stop the vectoriser).
#if defined(__CUDACC__)
#define SAMPLERD_WEIGHT_MATH_HD __host__ __device__ __forceinline__
#else
#define SAMPLERD_WEIGHT_MATH_HD inline __attribute__((always_inline))
#endif

namespace samplerd {
namespace weight_math {

// ---- Bits ------------------------------------------------------------------------------------

SAMPLERD_WEIGHT_MATH_HD uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

SAMPLERD_WEIGHT_MATH_HD float FloatFromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// `if_true` when `condition`, else `if_false`, selected on the bits. Both values are computed
// whatever the condition (as in a vector lane); with a plain `?:` a compiler may move a
// computation into its branch and then not vectorise the loop (an IEEE operation that may trap
// is not executed speculatively under the default -ftrapping-math).
SAMPLERD_WEIGHT_MATH_HD double Select(bool condition, double if_true, double if_false) {
  const uint64_t mask = -static_cast<uint64_t>(condition);
  return det::FromBits((det::Bits(if_true) & mask) | (det::Bits(if_false) & ~mask));
}

// ---- Validation of one sample ----------------------------------------------------------------

// On the IEEE bits of a float weight or EMA: 1 when it is not finite or < 0 (every pattern from
// +inf up, except -0, which is a zero), else 0.
SAMPLERD_WEIGHT_MATH_HD uint32_t BadBits(uint32_t b) {
  return static_cast<uint32_t>(b >= 0x7f800000u) & static_cast<uint32_t>(b != 0x80000000u);
}

// 1 when the float is > 0 and finite (subnormals included), else 0: the bits (+0, +inf).
SAMPLERD_WEIGHT_MATH_HD uint32_t PositiveBits(uint32_t b) {
  return static_cast<uint32_t>(b - 1u < 0x7f7fffffu);
}

// Whether a sample's EMA is defined: a loss was applied to it (count > 0), or its statistics say
// so (last_epoch > 0: restored statistics may have either). An undefined EMA is never read.
SAMPLERD_WEIGHT_MATH_HD bool EmaDefined(uint32_t count, uint32_t last_epoch) {
  return (count | last_epoch) != 0;
}

// The recompute's check of sample i: a base or current weight (nullptr: all 1, never bad) not
// finite or < 0, or a defined EMA not finite or < 0 (`ema_defined`: EmaDefined of its
// statistics, which the device keeps as a bit).
SAMPLERD_WEIGHT_MATH_HD bool SampleIsBad(const float* base, const float* current, bool ema_defined,
                                         float ema, uint64_t i) {
  return (ema_defined && BadBits(FloatBits(ema)) != 0) ||
         (base != nullptr && BadBits(FloatBits(base[i])) != 0) ||
         (current != nullptr && BadBits(FloatBits(current[i])) != 0);
}
SAMPLERD_WEIGHT_MATH_HD bool SampleIsBad(const float* base, const float* current,
                                         const SampleLossStats& stats, uint64_t i) {
  return SampleIsBad(base, current, EmaDefined(stats.count, stats.last_epoch), stats.ema_loss, i);
}

// ---- The loss signal: what the loss factor is a function of ------------------------------------

// The policies with a loss factor (policy_rules.h: the kFactor rules) differ only in the
// per-sample signal v_i that takes the EMA's place in the factor rule below (its prior, x_max
// and f_i): LOSS's is the EMA; REDUCIBLE_LOSS's is ReducibleLoss:
//   v_i = float(max(double(ema_i) - double(irr_i), 0)), irr_i the uploaded irreducible loss
//   (finite, >= 0). The difference is taken in double and rounded once to float; the maximum is
//   selected on the bits (a NaN EMA of an unseen sample, never read, gives +0). v_i is +0 or a
//   positive float.
SAMPLERD_WEIGHT_MATH_HD float ReducibleLoss(float ema, float irreducible) {
  const double d = static_cast<double>(ema) - static_cast<double>(irreducible);
  return static_cast<float>(Select(d > 0, d, 0.0));
}

// ---- The loss policy's factors ----------------------------------------------------------------

// What the factors need from the first pass (LossFactorRuleOf):
//   x_i = (count_i > 0 ? ema_i : prior) + epsilon,
//   f_i = float(x_i / x_max) when alpha == 1, else float(Exp2(alpha (Log2(x_i) - log2_x_max))),
// so f_i = (x_i / x_max)^alpha in (0, 1]: x_i^alpha up to a common factor, which the
// normalisation removes, without overflow (losses near the float maximum with alpha 8 would
// overflow even a double).
struct LossFactorRule {
  double prior = 0, epsilon = 0, alpha = 1, x_max = 1;
  double log2_x_max = 0;  // det::Log2(x_max).
};

// The rule from the first pass's findings: `seen` samples with count > 0, `ema_sum` the exact
// sum of their EMAs (exact_sum.h), `ema_max` their largest EMA (+0 if none; -0 counts as +0),
// `unseen` whether any sample has count 0. The prior loss of the unseen samples is the
// configured one (has_prior), else the mean EMA of the seen samples (0 if none). x_max =
// max(ema_max, the prior if some sample is unseen) + epsilon, which is max(x_i): rounding is
// monotone, so it is exact and independent of the order.
SAMPLERD_WEIGHT_MATH_HD LossFactorRule LossFactorRuleOf(bool has_prior, double prior_loss,
                                                        double epsilon, double alpha, uint64_t seen,
                                                        double ema_sum, float ema_max,
                                                        bool unseen) {
  LossFactorRule rule;
  rule.prior = has_prior ? prior_loss : seen > 0 ? ema_sum / static_cast<double>(seen) : 0.0;
  rule.epsilon = epsilon;
  rule.alpha = alpha;
  const double largest_seen = seen > 0 ? static_cast<double>(ema_max) : 0.0;
  const double unseen_prior = unseen ? rule.prior : 0.0;
  // std::max(largest_seen, unseen_prior): the first unless it is below the second.
  rule.x_max = (largest_seen < unseen_prior ? unseen_prior : largest_seen) + epsilon;
  rule.log2_x_max = det::Log2(rule.x_max);
  return rule;
}

// x_i from a sample's statistics (`seen`: count > 0; the EMA is not read otherwise).
SAMPLERD_WEIGHT_MATH_HD double LossX(bool seen, float ema, const LossFactorRule& rule) {
  return Select(seen, static_cast<double>(ema), rule.prior) + rule.epsilon;
}

// The two ways of f_i from x_i, before the rounding to float. The CPU's loops compute the
// second in three steps around its batched Log2/Exp2 (kernels/internal/det_math_batch.h), with
// LossExponent in the middle.
SAMPLERD_WEIGHT_MATH_HD double LossRatio(double x, const LossFactorRule& rule) {
  return x / rule.x_max;
}
SAMPLERD_WEIGHT_MATH_HD double LossExponent(double log2_x, const LossFactorRule& rule) {
  return rule.alpha * (log2_x - rule.log2_x_max);
}

// f_i.
SAMPLERD_WEIGHT_MATH_HD float LossFactor(bool seen, float ema, const LossFactorRule& rule) {
  const double x = LossX(seen, ema, rule);
  return static_cast<float>(rule.alpha == 1.0 ? LossRatio(x, rule)
                                              : det::Exp2(LossExponent(det::Log2(x), rule)));
}

// ---- Loss within groups (docs/SAMPLING.md, "Loss within groups") ------------------------------

// The group key of a base weight: its bits, -0 as +0 (SummaryBits' rule, below).
SAMPLERD_WEIGHT_MATH_HD uint32_t GroupKey(float base) {
  const uint32_t b = FloatBits(base);
  return b == 0x80000000u ? 0u : b;
}

// The group of a key: its position in keys[0, count), sorted ascending and holding it (binary
// search; the key is always there).
SAMPLERD_WEIGHT_MATH_HD uint32_t GroupOf(const uint32_t* keys, uint32_t count, uint32_t key) {
  uint32_t lo = 0, hi = count;  // keys[lo] <= key < keys[hi].
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (keys[mid] <= key) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The factor rule of one group: LOSS's rule with the group's largest x (`x_max`, > 0) as x_max.
SAMPLERD_WEIGHT_MATH_HD LossFactorRule GroupFactorRule(const LossFactorRule& global, double x_max) {
  LossFactorRule rule = global;
  rule.x_max = x_max;
  rule.log2_x_max = det::Log2(x_max);
  return rule;
}

// A group's factor sum is a fixed-point integer sum, so that a GPU adds it with integer atomics
// in any order: q_i = floor(f_i 2^40) (f_i in [0, 1], exact in double), added as two integers
// (q_i mod 2^24 and floor(q_i / 2^24)) that cannot overflow 64 bits for N <= 2^40.
constexpr int kGroupFactorBits = 40, kGroupFactorLowBits = 24;
SAMPLERD_WEIGHT_MATH_HD uint64_t GroupFactorUnits(float f) {
  return static_cast<uint64_t>(static_cast<double>(f) * 0x1p40);
}
SAMPLERD_WEIGHT_MATH_HD uint64_t GroupFactorLow(uint64_t units) {
  return units & ((uint64_t{1} << kGroupFactorLowBits) - 1);
}
SAMPLERD_WEIGHT_MATH_HD uint64_t GroupFactorHigh(uint64_t units) {
  return units >> kGroupFactorLowBits;
}

// A group's mean factor from the two integer sums and its sample count n_g: (high 2^-16 + low
// 2^-40) / n_g, in double in that order. >= 1 / n_g: the group's largest x has f = 1.
SAMPLERD_WEIGHT_MATH_HD double GroupFactorMean(uint64_t high_sum, uint64_t low_sum,
                                               uint64_t count) {
  const double sum =
      static_cast<double>(high_sum) * 0x1p-16 + static_cast<double>(low_sum) * 0x1p-40;
  return sum / static_cast<double>(count);
}

// The normalised factor that replaces f_i: float(f_i / mean_g). The raw weight is then LossRaw
// with mean_f = 1.
SAMPLERD_WEIGHT_MATH_HD float GroupNormalisedFactor(float f, double group_mean) {
  return static_cast<float>(static_cast<double>(f) / group_mean);
}

// ---- Raw weights, clamp, result ---------------------------------------------------------------

// The loss policy's raw weight: base_i ((1 - mix) f_i / mean_f + mix), with one_minus_mix =
// 1.0 - mix computed once; `weight` is base_i (1 without base weights).
SAMPLERD_WEIGHT_MATH_HD double LossRaw(double weight, float f, double one_minus_mix, double mean_f,
                                       double mix) {
  return weight * (one_minus_mix * static_cast<double>(f) / mean_f + mix);
}

// The loss policy's mean raw weight, in closed form from the exact sums of the factor pass (so
// that no pass of its own sums the raw weights): with mean_bf = S_bf / N (S_bf the exact sum of
// BaseFactorTerm) and mean_b = S_b / N (S_b the exact sum of the base weights),
//   mean_raw = one_minus_mix mean_bf / mean_f + mix mean_b,
// the mean of LossRaw's base_i ((1 - mix) f_i / mean_f + mix) up to rounding. Without base
// weights mean_bf = mean_f and mean_b = 1.
SAMPLERD_WEIGHT_MATH_HD double LossRawMean(double one_minus_mix, double mean_f, double mix,
                                           double mean_bf, double mean_b) {
  return one_minus_mix * mean_bf / mean_f + mix * mean_b;
}

// The term of S_bf: base_i f_i in double, which is exact (a product of two floats has at most
// 48 significant bits and its exponent stays in the double range).
SAMPLERD_WEIGHT_MATH_HD double BaseFactorTerm(float base, float f) {
  return static_cast<double>(base) * static_cast<double>(f);
}

// The multiplicative policy's raw weight: current_i (1 + eta ema_i) for a sample seen in the
// closed epoch (its last_epoch is the closed epoch's marker), else current_i; `weight` is
// current_i (1 without current weights). In double: the product may pass the float range before
// the normalisation. Computed for every sample and selected: an unseen sample's EMA may be
// undefined (NaN), which the selection drops.
SAMPLERD_WEIGHT_MATH_HD double MultiplicativeRaw(double weight, float ema, bool seen_in_closed,
                                                 double eta) {
  const double updated = weight * (1.0 + eta * static_cast<double>(ema));
  return Select(seen_in_closed, updated, weight);
}

// The clamp between the two normalisations: `mean` the mean raw weight.
struct ClampRule {
  double mean = 1, lo = 0, hi = 0;
};

// c_i = 0 for an excluded sample (a zero base weight for the loss policy, a zero current weight
// for the multiplicative one: never drawn), else std::clamp(mean > 0 ? raw_i / mean : 1.0, lo,
// hi). mean == 0: every raw weight vanished, so the samples that are not excluded are equal.
SAMPLERD_WEIGHT_MATH_HD double Clamped(double raw, bool excluded, const ClampRule& clamp) {
  const double scaled = Select(clamp.mean > 0, raw / clamp.mean, 1.0);
  // std::clamp's definition: lo if scaled < lo, else hi if hi < scaled, else scaled.
  const double c = Select(scaled < clamp.lo, clamp.lo, Select(clamp.hi < scaled, clamp.hi, scaled));
  return Select(excluded, 0.0, c);
}

// W_{e+1, i} from c_i and the mean of the c_i.
SAMPLERD_WEIGHT_MATH_HD float FinalWeight(double clamped, double mean_clamped) {
  return static_cast<float>(clamped / mean_clamped);
}

// The mean of n terms from their exact sum (exact_sum.h): every mean of the recompute.
SAMPLERD_WEIGHT_MATH_HD double MeanOf(double exact_sum, uint64_t n) {
  return exact_sum / static_cast<double>(n);
}

// ---- The effective sample size floor (docs/SAMPLING.md, "Effective sample size floor") --------

// Whether the floor is met: MeetsEssFloor (below, with the summary's sums).
// The mix that the floor sets, from the configured `mix` and meets(m): whether the final weights
// computed with mix m (every pass after the factors: raw mean, clamp, result) meet the floor.
//   meets(mix):  mix (the floor is met, nothing changes);
//   !meets(1):   1 (no mix meets it: the weights are the clamped base weights);
//   otherwise a bisection of kEssFloorSteps steps on [lo, hi] = [mix, 1]: mid = lo + (hi - lo)
//   * 0.5; hi = mid if meets(mid), else lo = mid; the result is hi (a mix that meets the floor,
//   within 2^-20 of the smallest such mix when meets is monotone).
// meets is called at most kEssFloorSteps + 2 times, in this order; the result depends on its
// answers only, so backends that compute the same bits return the same mix.
constexpr int kEssFloorSteps = 20;
#if defined(__CUDACC__)
// A host backend's `meets` runs passes of its own (the CUDA backend's: device kernels, from the
// host): nvcc's host/device check of the call is for device callers only.
#pragma nv_exec_check_disable
#endif
template <typename Meets>
SAMPLERD_WEIGHT_MATH_HD double EssFloorMix(double mix, const Meets& meets) {
  if (meets(mix)) return mix;
  if (!meets(1.0)) return 1.0;
  double lo = mix, hi = 1.0;
  for (int step = 0; step < kEssFloorSteps; ++step) {
    const double mid = lo + (hi - lo) * 0.5;
    if (meets(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

// ---- The summary of a weight vector -----------------------------------------------------------

// What min and max compare: the bits of a valid weight (finite, >= 0) with -0 taken as +0, so
// that the extremes do not depend on which zero a reduction meets first (non-negative floats
// order like their bits).
SAMPLERD_WEIGHT_MATH_HD uint32_t SummaryBits(float w) {
  const uint32_t b = FloatBits(w);
  return b == 0x80000000u ? 0u : b;
}

// S1 and S2 are the exact sums (exact_sum.h, chunks of exact_sum::kChunk) of the terms w_i and
// double(w_i)^2 (a float's square is exact in double).
SAMPLERD_WEIGHT_MATH_HD double SquareTerm(float w) {
  const double d = static_cast<double>(w);
  return d * d;
}

// S1^2 / S2; 0 when S2 == 0 (no weight is positive).
SAMPLERD_WEIGHT_MATH_HD double EffectiveSampleSize(double s1, double s2) {
  return s2 > 0 ? s1 * s1 / s2 : 0.0;
}

// The effective sample size floor: whether weights whose exact sums are S1 (of w_i) and S2 (of
// double(w_i)^2) have Kish's S1^2 / S2 >= fraction * N, in double.
SAMPLERD_WEIGHT_MATH_HD bool MeetsEssFloor(double s1, double s2, double fraction, uint64_t n) {
  return EffectiveSampleSize(s1, s2) >= fraction * static_cast<double>(n);
}

}  // namespace weight_math
}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_WEIGHT_MATH_H_
