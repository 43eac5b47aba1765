#include "kernels/internal/group_factors.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/internal/parallel.h"

namespace samplerd {
namespace internal {
namespace {

template <typename Rule>
double XOf(const Rule& r, const RecomputeArrays& a, const weight_math::LossFactorRule& rule,
           uint64_t i) {
  return weight_math::LossX(a.stats[i].count > 0, r.Signal(a.stats[i].ema_loss, i), rule);
}

uint32_t GroupAt(const RecomputeArrays& a, const LossGroupTable& groups, uint64_t i) {
  return weight_math::GroupOf(groups.keys.data(), groups.size(), weight_math::GroupKey(a.base[i]));
}

template <typename Rule>
void GroupFactorsTyped(const Rule& r, int threads, const RecomputeArrays& a,
                       const weight_math::LossFactorRule& global, const LossGroupTable& groups,
                       uint64_t n) {
  const uint32_t k = groups.size();
  const int parts = ThreadsFor(threads, n);
  // 1. The largest x of each group, by its bits (x > 0: doubles order like their bits), per
  // thread, then the maximum of the threads'.
  std::vector<std::vector<uint64_t>> part_max(parts, std::vector<uint64_t>(k, 0));
  ParallelForThreads(threads, n, [&](int t, uint64_t b, uint64_t e) {
    std::vector<uint64_t>& max = part_max[t];
    for (uint64_t i = b; i < e; ++i) {
      const uint32_t g = GroupAt(a, groups, i);
      max[g] = std::max(max[g], det::Bits(XOf(r, a, global, i)));
    }
  });
  std::vector<weight_math::LossFactorRule> rules(k);
  for (uint32_t g = 0; g < k; ++g) {
    uint64_t bits = 0;
    for (int t = 0; t < parts; ++t) bits = std::max(bits, part_max[t][g]);
    rules[g] = weight_math::GroupFactorRule(global, det::FromBits(bits));
  }
  // 2. f_i into out, and the groups' fixed-point sums (integers: any order).
  std::vector<std::vector<uint64_t>> part_low(parts, std::vector<uint64_t>(k, 0));
  std::vector<std::vector<uint64_t>> part_high(parts, std::vector<uint64_t>(k, 0));
  ParallelForThreads(threads, n, [&](int t, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) {
      const uint32_t g = GroupAt(a, groups, i);
      const float f =
          weight_math::LossFactor(a.stats[i].count > 0, r.Signal(a.stats[i].ema_loss, i), rules[g]);
      a.out[i] = f;
      const uint64_t units = weight_math::GroupFactorUnits(f);
      part_low[t][g] += weight_math::GroupFactorLow(units);
      part_high[t][g] += weight_math::GroupFactorHigh(units);
    }
  });
  std::vector<double> mean(k);
  for (uint32_t g = 0; g < k; ++g) {
    uint64_t low = 0, high = 0;
    for (int t = 0; t < parts; ++t) {
      low += part_low[t][g];
      high += part_high[t][g];
    }
    mean[g] = weight_math::GroupFactorMean(high, low, groups.counts[g]);
  }
  // 3. The normalised factors.
  ParallelForThreads(threads, n, [&](int, uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) {
      a.out[i] = weight_math::GroupNormalisedFactor(a.out[i], mean[GroupAt(a, groups, i)]);
    }
  });
}

}  // namespace

void GroupFactors(int threads, const RecomputeArrays& arrays, const RawWeightRule& rule,
                  const weight_math::LossFactorRule& global, const LossGroupTable& groups,
                  uint64_t n) {
  VisitPolicyRule(rule.kind, RuleInputsOf(arrays, rule), [&](const auto& r) {
    if constexpr (std::decay_t<decltype(r)>::kShape == PolicyRuleShape::kFactor) {
      GroupFactorsTyped(r, threads, arrays, global, groups, n);
    }
  });
}

}  // namespace internal
}  // namespace samplerd
