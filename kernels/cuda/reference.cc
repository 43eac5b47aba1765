#include "kernels/cuda/reference.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/exact_sum.h"
#include "kernels/loss_groups.h"
#include "kernels/policy_rules.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace gpu {
namespace reference {

std::vector<uint64_t> SelectEfraimidisSpirakis(uint64_t seed, uint64_t epoch, uint64_t n,
                                               uint64_t m, const float* weights) {
  std::vector<std::pair<uint64_t, uint64_t>> keyed(n);
  for (uint64_t i = 0; i < n; ++i) {
    keyed[i] = {plan_math::EsKeyBits(seed, epoch, i, weights == nullptr ? 1.0f : weights[i]), i};
  }
  std::nth_element(keyed.begin(), keyed.begin() + (m - 1), keyed.end());
  std::vector<uint64_t> selected(m);
  for (uint64_t k = 0; k < m; ++k) selected[k] = keyed[k].second;
  std::sort(selected.begin(), selected.end());
  return selected;
}

std::vector<uint64_t> Shuffle(uint64_t seed, uint64_t epoch, const std::vector<uint64_t>& inputs,
                              int bucket_bits) {
  const uint64_t buckets = uint64_t{1} << bucket_bits;
  std::vector<std::vector<uint64_t>> bucket(buckets);
  for (uint64_t k = 0; k < inputs.size(); ++k) {
    bucket[plan_math::ShuffleBucketOf(seed, epoch, bucket_bits, k)].push_back(inputs[k]);
  }
  std::vector<uint64_t> out;
  out.reserve(inputs.size());
  for (uint64_t b = 0; b < buckets; ++b) {
    std::vector<uint64_t>& a = bucket[b];
    plan_math::SwapWords words(seed, epoch, b);
    for (uint64_t i = a.size(); i-- > 1;) {
      std::swap(a[i], a[words.SwapTarget(static_cast<uint32_t>(i))]);
    }
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

std::vector<uint64_t> QuantisedPrefix(const float* weights, uint64_t n) {
  uint32_t max_bits = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &weights[i], sizeof bits);
    if (bits != 0x80000000u) max_bits = std::max(max_bits, bits);  // -0 is a zero weight.
  }
  const double scale = plan_math::QuantisationScale(n, max_bits);
  std::vector<uint64_t> prefix(n + 1, 0);
  for (uint64_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + plan_math::Quantise(weights[i], scale);
  return prefix;
}

std::vector<uint64_t> Draws(const std::vector<uint64_t>& prefix, uint64_t n, uint64_t seed,
                            uint64_t epoch, uint64_t first, uint64_t count) {
  std::vector<uint64_t> out(count);
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t r = RandomBits64(seed, epoch, RandomStream::kDraw, first + k);
    if (prefix.empty()) {
      out[k] = MulHi64(r, n);
    } else {
      const uint64_t t = MulHi64(r, prefix.back());
      out[k] = static_cast<uint64_t>(std::upper_bound(prefix.begin(), prefix.end(), t) -
                                     prefix.begin() - 1);
    }
  }
  return out;
}

std::vector<uint64_t> Plan(const PlanInputs& in, int (*bucket_bits_rule)(uint64_t)) {
  if (in.sequential) {
    std::vector<uint64_t> plan(in.n);
    for (uint64_t i = 0; i < in.n; ++i) plan[i] = i;
    return plan;
  }
  if (in.replacement) {
    const std::vector<uint64_t> prefix =
        in.weights == nullptr ? std::vector<uint64_t>() : QuantisedPrefix(in.weights, in.n);
    return Draws(prefix, in.n, in.seed, in.epoch, 0, in.m);
  }
  std::vector<uint64_t> selected;
  if (in.m == in.n) {
    selected.resize(in.n);
    for (uint64_t i = 0; i < in.n; ++i) selected[i] = i;
  } else {
    selected = SelectEfraimidisSpirakis(in.seed, in.epoch, in.n, in.m, in.weights);
  }
  return Shuffle(in.seed, in.epoch, selected, bucket_bits_rule(in.m));
}

std::vector<uint64_t> Shard(const std::vector<uint64_t>& plan, const ShardSpec& layout,
                            uint32_t rank, uint64_t start, uint64_t count) {
  std::vector<uint64_t> out(count);
  for (uint64_t k = 0; k < count; ++k) {
    out[k] = plan[plan_math::ShardPlanPosition(plan.size(), layout, rank, start + k)];
  }
  return out;
}

double ExactSum(uint64_t n, const std::function<double(uint64_t)>& term) {
  std::vector<exact_sum::ChunkSum> chunks;
  std::vector<double> terms;
  for (uint64_t begin = 0; begin < n; begin += exact_sum::kChunk) {
    const uint64_t end = std::min(n, begin + exact_sum::kChunk);
    terms.clear();
    for (uint64_t i = begin; i < end; ++i) terms.push_back(term(i));
    chunks.push_back(exact_sum::SumChunk(terms.data(), terms.size()));
  }
  return exact_sum::Total(chunks.data(), chunks.size());
}

namespace {

namespace wm = weight_math;

float WeightOr1(const float* w, uint64_t i) { return w == nullptr ? 1.0f : w[i]; }

// The factors f_i of a kFactor rule (with loss_within_groups: normalised within each group),
// and raw_mean_of(mix), the mean raw weight with a given mix.
template <typename Rule>
void FactorsOf(const Rule& r, const RecomputeParams& params, uint64_t n, const float* base,
               const SampleLossStats* stats, std::vector<float>* f, double* mean_f,
               std::function<double(double)>* raw_mean_of) {
  // The signal (the EMA for LOSS; REDUCIBLE_LOSS: the EMA less the irreducible loss, clamped
  // at 0).
  auto signal = [&](uint64_t i) { return r.Signal(stats[i].ema_loss, i); };
  uint64_t seen = 0;
  double ema_max = 0;  // std::max keeps +0 against -0.
  bool unseen = false;
  for (uint64_t i = 0; i < n; ++i) {
    if (stats[i].count > 0) {
      ++seen;
      ema_max = std::max(ema_max, static_cast<double>(signal(i)));
    } else {
      unseen = true;
    }
  }
  const double ema_sum = ExactSum(
      n, [&](uint64_t i) { return stats[i].count > 0 ? static_cast<double>(signal(i)) : 0.0; });
  const wm::LossFactorRule rule =
      wm::LossFactorRuleOf(params.has_prior_loss, params.prior_loss, params.epsilon, params.alpha,
                           seen, ema_sum, static_cast<float>(ema_max), unseen);
  f->resize(n);
  for (uint64_t i = 0; i < n; ++i) (*f)[i] = wm::LossFactor(stats[i].count > 0, signal(i), rule);
  *mean_f = wm::MeanOf(ExactSum(n, [&](uint64_t i) { return static_cast<double>((*f)[i]); }), n);
  if (params.within_groups) {
    // Loss within groups: the factors again, with each group's own x_max, normalised by the
    // group's fixed-point mean; then LossRaw with mean_f = 1 and the base weights' mean.
    LossGroupTable groups;
    FindLossGroups(base, n, ~uint64_t{0}, &groups);
    auto group_of = [&](uint64_t i) {
      return wm::GroupOf(groups.keys.data(), groups.size(), wm::GroupKey(base[i]));
    };
    std::vector<double> x_max(groups.size(), 0.0);
    for (uint64_t i = 0; i < n; ++i) {
      const double x = wm::LossX(stats[i].count > 0, signal(i), rule);
      x_max[group_of(i)] = std::max(x_max[group_of(i)], x);
    }
    std::vector<uint64_t> low(groups.size(), 0), high(groups.size(), 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t g = group_of(i);
      (*f)[i] = wm::LossFactor(stats[i].count > 0, signal(i), wm::GroupFactorRule(rule, x_max[g]));
      low[g] += wm::GroupFactorLow(wm::GroupFactorUnits((*f)[i]));
      high[g] += wm::GroupFactorHigh(wm::GroupFactorUnits((*f)[i]));
    }
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t g = group_of(i);
      (*f)[i] = wm::GroupNormalisedFactor((*f)[i],
                                          wm::GroupFactorMean(high[g], low[g], groups.counts[g]));
    }
    *mean_f = 1.0;
    const double mean_b =
        wm::MeanOf(ExactSum(n, [&](uint64_t i) { return static_cast<double>(base[i]); }), n);
    *raw_mean_of = [mean_b](double) { return mean_b; };
    return;
  }
  double mean_bf = *mean_f, mean_b = 1.0;
  if (base != nullptr) {
    mean_bf = wm::MeanOf(
        ExactSum(n, [&](uint64_t i) { return wm::BaseFactorTerm(base[i], (*f)[i]); }), n);
    mean_b = wm::MeanOf(ExactSum(n, [&](uint64_t i) { return static_cast<double>(base[i]); }), n);
  }
  const double m_f = *mean_f;
  *raw_mean_of = [=](double m) { return wm::LossRawMean(1.0 - m, m_f, m, mean_bf, mean_b); };
}

// W_{e+1} after the check, for the rule `r` (a kFactor or kDirect rule).
template <typename Rule>
std::vector<float> RecomputeChecked(const Rule& r, const RecomputeParams& params, uint64_t n,
                                    const float* base, const float* current,
                                    const SampleLossStats* stats) {
  std::function<double(uint64_t)> raw;
  std::function<bool(uint64_t)> excluded;
  double raw_mean = 0;
  // The mix of a kFactor rule: the configured one, raised by the floor below.
  double mix = params.mix;
  std::vector<float> f;
  if constexpr (Rule::kShape == PolicyRuleShape::kFactor) {
    double mean_f = 1;
    std::function<double(double)> raw_mean_of;  // The mean raw weight with a given mix.
    FactorsOf(r, params, n, base, stats, &f, &mean_f, &raw_mean_of);
    raw = [&, mean_f](uint64_t i) {
      return wm::LossRaw(WeightOr1(base, i), f[i], 1.0 - mix, mean_f, mix);
    };
    excluded = [&](uint64_t i) { return base != nullptr && base[i] == 0; };
    if (params.min_effective_fraction > 0) {
      // The effective sample size floor: the weights with each trial mix, summed as the
      // summary sums them.
      mix = wm::EssFloorMix(mix, [&](double trial) {
        mix = trial;  // raw() reads it.
        const wm::ClampRule clamp{raw_mean_of(trial), params.clamp_lo, params.clamp_hi};
        auto clamped = [&](uint64_t i) { return wm::Clamped(raw(i), excluded(i), clamp); };
        const double mean_clamped = wm::MeanOf(ExactSum(n, clamped), n);
        auto final_weight = [&](uint64_t i) { return wm::FinalWeight(clamped(i), mean_clamped); };
        return wm::MeetsEssFloor(
            ExactSum(n, [&](uint64_t i) { return static_cast<double>(final_weight(i)); }),
            ExactSum(n, [&](uint64_t i) { return wm::SquareTerm(final_weight(i)); }),
            params.min_effective_fraction, n);
      });
    }
    raw_mean = raw_mean_of(mix);
  } else {
    raw = [&](uint64_t i) {
      return r.Raw(WeightOr1(current, i), stats[i].ema_loss, stats[i].last_epoch, i);
    };
    excluded = [&](uint64_t i) { return current != nullptr && current[i] == 0; };
    raw_mean = wm::MeanOf(ExactSum(n, raw), n);
  }
  const wm::ClampRule clamp{raw_mean, params.clamp_lo, params.clamp_hi};
  auto clamped = [&](uint64_t i) { return wm::Clamped(raw(i), excluded(i), clamp); };
  const double mean_clamped = wm::MeanOf(ExactSum(n, clamped), n);
  std::vector<float> weights(n);
  for (uint64_t i = 0; i < n; ++i) weights[i] = wm::FinalWeight(clamped(i), mean_clamped);
  return weights;
}

}  // namespace

Recomputed RecomputeWeights(const RecomputeParams& params, uint64_t n, const float* base,
                            const float* current, const SampleLossStats* stats) {
  Recomputed result;
  RecomputeCheck& check = result.check;
  for (uint64_t i = 0; i < n; ++i) {
    if (wm::SampleIsBad(base, current, stats[i], i)) {
      check.first_bad = i;
      break;
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (base != nullptr && wm::PositiveBits(wm::FloatBits(base[i]))) check.base_positive = true;
    if (current != nullptr && wm::PositiveBits(wm::FloatBits(current[i]))) {
      check.current_positive = true;
    }
  }
  VisitPolicyRule(params.loss, params.rule_inputs(), [&](const auto& r) {
    using Rule = std::decay_t<decltype(r)>;
    if constexpr (Rule::kShape != PolicyRuleShape::kNone) {
      if (check.first_bad != ~uint64_t{0} || (base != nullptr && !check.base_positive) ||
          (Rule::kShape == PolicyRuleShape::kDirect && current != nullptr &&
           !check.current_positive)) {
        return;
      }
      result.weights = RecomputeChecked(r, params, n, base, current, stats);
    }
  });
  return result;
}

WeightSummaryValues SummarizeWeights(const float* weights, uint64_t n) {
  WeightSummaryValues s;
  s.min = weight_math::FloatFromBits(weight_math::SummaryBits(weights[0]));
  s.max = s.min;
  for (uint64_t i = 0; i < n; ++i) {
    const double w = weight_math::FloatFromBits(weight_math::SummaryBits(weights[i]));  // -0: +0.
    s.min = std::min(s.min, w);
    s.max = std::max(s.max, w);
    s.zero_count += w == 0;
  }
  const double s1 = ExactSum(n, [&](uint64_t i) { return static_cast<double>(weights[i]); });
  const double s2 = ExactSum(n, [&](uint64_t i) { return weight_math::SquareTerm(weights[i]); });
  s.mean = weight_math::MeanOf(s1, n);
  s.effective_sample_size = weight_math::EffectiveSampleSize(s1, s2);
  return s;
}

void ApplyLosses(std::vector<SampleLossStats>& stats, const std::vector<uint64_t>& indices,
                 const std::vector<float>& losses, uint16_t marker, float decay) {
  for (size_t k = 0; k < indices.size(); ++k)
    ApplyLoss(stats[indices[k]], losses[k], marker, decay);
}

std::vector<float> GatherImportance(const float* weights, const std::vector<uint64_t>& indices) {
  std::vector<float> out(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) out[k] = 1.0f / weights[indices[k]];
  return out;
}

}  // namespace reference
}  // namespace gpu
}  // namespace samplerd
