// The loss policies' kinds and their per-sample rules: one rule type per LossWeightKind, host and
// device, and the one dispatch from a kind to its rule (VisitPolicyRule). The recompute passes
// are templates over the rule, written once per executable definition and never naming a kind:
// the CPU backend's (kernels/internal/recompute_passes.cc, kernels/internal/group_factors.cc,
// kernels/cpu_backend.cc), the CUDA kernels (kernels/cuda/device_weights.cu) and the sequential
// host reference (kernels/cuda/reference.cc). docs/CONTRIBUTING.md, "Adding a weight policy".
//
// A rule is a small value type with kKind, kShape, HasInputs() (whether the inputs it reads were
// given: a backend's precondition) and the function of its shape. It has one of three shapes
// (kShape), which fix what the passes do with it:
//   kNone:   no loss factor; the weights are the base weights (the passes only validate).
//   kFactor: LOSS's shape: the weight is the loss factor (weight_math.h: LossFactor, with its
//            prior, x_max, mix, clamps, effective-sample-size floor and loss within groups) of a
//            per-sample signal, Signal(ema, i), which takes the EMA's place; the raw weight is
//            weight_math::LossRaw of the base weights, and a zero base weight excludes a sample.
//   kDirect: the raw weight is Raw(current_i, ema_i, last_epoch_i, i) of the current weights W_e
//            (1 without them), whose mean is summed in the first pass; a zero current weight
//            excludes a sample.
// kFactor and kDirect agree with the descriptor's loss_factor and reads_current
// (loss_policies.h; policy_rules_test checks it). Every rule's arithmetic is weight_math.h's (IEEE
// operations in double in a fixed order, no FMA, no libm), so every definition gets the same bits.
//
// A rule's parameters are plain values and pointers (PolicyRuleInputs): host pointers for the
// CPU and the reference, device pointers in a kernel. Header-only, free of Abseil and libm (nvcc
// compiles it for the device). Thread-safe (pure).
#ifndef SAMPLERD_KERNELS_POLICY_RULES_H_
#define SAMPLERD_KERNELS_POLICY_RULES_H_

#include <cstdint>

#include "kernels/weight_math.h"

// VisitPolicyRule is host code that the CPU's passes call from functions compiled per SIMD
// level: force-inlined there, as weight_math.h's rules.
#if defined(__CUDACC__)
#define SAMPLERD_POLICY_RULE_DISPATCH __host__ __forceinline__
#else
#define SAMPLERD_POLICY_RULE_DISPATCH inline __attribute__((always_inline))
#endif

namespace samplerd {

// The loss policies (proto LossPolicy; loss_policies.h holds each one's descriptor).
enum class LossWeightKind { kNone, kLoss, kMultiplicative, kReducibleLoss };

enum class PolicyRuleShape { kNone, kFactor, kDirect };

// What a rule may read besides a sample's statistics and weights (each rule takes what it needs).
struct PolicyRuleInputs {
  // REDUCIBLE_LOSS: the N irreducible losses (finite, >= 0); nullptr for every other policy.
  const float* irreducible = nullptr;
  double eta = 1.0;     // MULTIPLICATIVE: policy.eta.
  uint16_t marker = 0;  // MULTIPLICATIVE: EpochMarker(closed epoch) (loss_stats.h).
};

// NONE: W_{e+1} is the base weights.
struct NoLossRule {
  static constexpr LossWeightKind kKind = LossWeightKind::kNone;
  static constexpr PolicyRuleShape kShape = PolicyRuleShape::kNone;
  SAMPLERD_WEIGHT_MATH_HD bool HasInputs() const { return true; }
};

// LOSS: the signal is the EMA.
struct LossRule {
  static constexpr LossWeightKind kKind = LossWeightKind::kLoss;
  static constexpr PolicyRuleShape kShape = PolicyRuleShape::kFactor;
  SAMPLERD_WEIGHT_MATH_HD bool HasInputs() const { return true; }
  SAMPLERD_WEIGHT_MATH_HD float Signal(float ema, uint64_t) const { return ema; }
};

// REDUCIBLE_LOSS: the signal is weight_math::ReducibleLoss(ema_i, irreducible_i).
struct ReducibleLossRule {
  static constexpr LossWeightKind kKind = LossWeightKind::kReducibleLoss;
  static constexpr PolicyRuleShape kShape = PolicyRuleShape::kFactor;
  const float* irreducible = nullptr;
  SAMPLERD_WEIGHT_MATH_HD bool HasInputs() const { return irreducible != nullptr; }
  SAMPLERD_WEIGHT_MATH_HD float Signal(float ema, uint64_t i) const {
    return weight_math::ReducibleLoss(ema, irreducible[i]);
  }
};

// MULTIPLICATIVE: weight_math::MultiplicativeRaw, "seen in the closed epoch" by the marker.
struct MultiplicativeRule {
  static constexpr LossWeightKind kKind = LossWeightKind::kMultiplicative;
  static constexpr PolicyRuleShape kShape = PolicyRuleShape::kDirect;
  double eta = 1.0;
  uint16_t marker = 0;
  SAMPLERD_WEIGHT_MATH_HD bool HasInputs() const { return true; }
  SAMPLERD_WEIGHT_MATH_HD double Raw(double current, float ema, uint32_t last_epoch,
                                     uint64_t) const {
    return weight_math::MultiplicativeRaw(current, ema, last_epoch == marker, eta);
  }
};

// f(rule) with the rule of `kind` made from `inputs`; returns what f returns (every
// instantiation of f must return the same type). The one place where a kind chooses code.
template <typename F>
SAMPLERD_POLICY_RULE_DISPATCH decltype(auto) VisitPolicyRule(LossWeightKind kind,
                                                             const PolicyRuleInputs& inputs,
                                                             F&& f) {
  switch (kind) {
    case LossWeightKind::kLoss:
      return f(LossRule{});
    case LossWeightKind::kReducibleLoss:
      return f(ReducibleLossRule{inputs.irreducible});
    case LossWeightKind::kMultiplicative:
      return f(MultiplicativeRule{inputs.eta, inputs.marker});
    case LossWeightKind::kNone:
      break;
  }
  return f(NoLossRule{});
}

}  // namespace samplerd

#endif  // SAMPLERD_KERNELS_POLICY_RULES_H_
