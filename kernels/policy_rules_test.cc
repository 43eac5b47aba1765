#include "kernels/policy_rules.h"

#include <cstdint>
#include <limits>
#include <type_traits>

#include "gtest/gtest.h"
#include "kernels/loss_policies.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace {

// Every descriptor's kind has a rule (VisitPolicyRule never falls back for it), and the rule's
// shape is what the descriptor says: kFactor for a loss factor, kDirect for a policy that keeps
// statistics and reads the current weights, kNone for no statistics.
TEST(PolicyRulesTest, EveryDescriptorHasARuleOfItsShape) {
  for (const LossPolicyDescriptor& d : kLossPolicies) {
    SCOPED_TRACE(d.proto_name);
    const float irreducible[1] = {0.0f};
    PolicyRuleInputs inputs;
    inputs.irreducible = irreducible;
    VisitPolicyRule(d.kind, inputs, [&](const auto& rule) {
      using Rule = std::decay_t<decltype(rule)>;
      EXPECT_EQ(Rule::kKind, d.kind);
      EXPECT_EQ(Rule::kShape == PolicyRuleShape::kFactor, d.loss_factor);
      EXPECT_EQ(Rule::kShape == PolicyRuleShape::kDirect, d.uses_loss_stats && !d.loss_factor);
      EXPECT_EQ(Rule::kShape == PolicyRuleShape::kDirect, d.reads_current);
      EXPECT_EQ(Rule::kShape == PolicyRuleShape::kNone, !d.uses_loss_stats);
      EXPECT_TRUE(rule.HasInputs());
    });
  }
}

// A rule without the per-sample input it reads says so (the CUDA kernels refuse it).
TEST(PolicyRulesTest, ReducibleLossNeedsItsIrreducibleLosses) {
  VisitPolicyRule(LossWeightKind::kReducibleLoss, PolicyRuleInputs{}, [](const auto& rule) {
    EXPECT_FALSE(rule.HasInputs());
  });
}

// The rules' arithmetic on a worked example: LOSS's signal is the EMA; REDUCIBLE_LOSS's the EMA
// less the irreducible loss, 0 when negative (and for a NaN EMA); MULTIPLICATIVE's raw weight is
// current (1 + eta ema) for a sample seen in the closed epoch (its marker), else current.
TEST(PolicyRulesTest, RulesOnAWorkedExample) {
  const float irreducible[3] = {0.25f, 2.0f, 0.0f};
  PolicyRuleInputs inputs;
  inputs.irreducible = irreducible;
  inputs.eta = 0.5;
  inputs.marker = 7;
  EXPECT_EQ(LossRule{}.Signal(1.5f, 0), 1.5f);
  const ReducibleLossRule reducible{irreducible};
  EXPECT_EQ(reducible.Signal(1.5f, 0), 1.25f);
  EXPECT_EQ(reducible.Signal(1.5f, 1), 0.0f);
  EXPECT_EQ(weight_math::FloatBits(reducible.Signal(-0.0f, 2)), 0u);  // +0, not -0.
  EXPECT_EQ(reducible.Signal(std::numeric_limits<float>::quiet_NaN(), 2), 0.0f);
  const MultiplicativeRule multiplicative{inputs.eta, inputs.marker};
  EXPECT_EQ(multiplicative.Raw(2.0, 3.0f, 7, 0), 5.0);  // 2 (1 + 0.5 * 3).
  EXPECT_EQ(multiplicative.Raw(2.0, 3.0f, 6, 0), 2.0);  // Not seen in the closed epoch.
  // VisitPolicyRule passes the inputs to the rule it makes.
  EXPECT_EQ(VisitPolicyRule(LossWeightKind::kReducibleLoss, inputs,
                            [](const auto& rule) -> double {
                              using Rule = std::decay_t<decltype(rule)>;
                              if constexpr (Rule::kShape == PolicyRuleShape::kFactor) {
                                return rule.Signal(1.0f, 0);
                              } else {
                                return -1.0;
                              }
                            }),
            0.75);
  EXPECT_EQ(VisitPolicyRule(LossWeightKind::kMultiplicative, inputs,
                            [](const auto& rule) -> double {
                              using Rule = std::decay_t<decltype(rule)>;
                              if constexpr (Rule::kShape == PolicyRuleShape::kDirect) {
                                return rule.Raw(1.0, 1.0f, 7, 0);
                              } else {
                                return -1.0;
                              }
                            }),
            1.5);
}

}  // namespace
}  // namespace samplerd
