#include "kernels/weight_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/det_math.h"
#include "kernels/exact_sum.h"
#include "kernels/loss_groups.h"
#include "kernels/loss_policies.h"
#include "kernels/weight_math.h"

namespace samplerd {
namespace {

absl::Status CheckRange(const char* field, double value, double lo, double hi, bool lo_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("policy.", field, " = ", value, " is outside ",
                                                 lo_open ? "(" : "[", lo, ", ", hi, "]"));
}

}  // namespace

absl::Status ValidatePolicy(const WeightPolicyParams& p) {
  if (!(p.class_balance_beta >= 0 && p.class_balance_beta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.class_balance_beta = ", p.class_balance_beta, " is outside [0, 1)"));
  }
  if (!(p.ema_decay >= 0 && p.ema_decay < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.ema_decay = ", p.ema_decay, " is outside [0, 1)"));
  }
  for (absl::Status s :
       {CheckRange("alpha", p.alpha, 0, 8, false), CheckRange("epsilon", p.epsilon, 0, 1e6, true),
        CheckRange("mix", p.mix, 0, 1, false), CheckRange("clamp_lo", p.clamp_lo, 0, 1, true),
        CheckRange("clamp_hi", p.clamp_hi, 1, 1e6, false),
        CheckRange("eta", p.eta, 0, 100, true),
        CheckRange("min_effective_fraction", p.min_effective_fraction, 0, 1, false)}) {
    if (!s.ok()) return s;
  }
  if (p.prior_loss.has_value() && !(std::isfinite(*p.prior_loss) && *p.prior_loss >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.prior_loss = ", *p.prior_loss, ": must be finite and >= 0"));
  }
  if (p.loss_within_groups &&
      (!DescriptorOf(p.loss).allows_within_groups || p.base == BaseWeightKind::kUniform)) {
    return absl::InvalidArgumentError(
        "policy.loss_within_groups = true needs loss = LOSS or REDUCIBLE_LOSS and base = STATIC "
        "or CLASS_BALANCED (the groups are the samples of equal base weight)");
  }
  if (p.min_effective_fraction > 0 && !DescriptorOf(p.loss).loss_factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.min_effective_fraction = ", p.min_effective_fraction,
        " needs loss = LOSS or REDUCIBLE_LOSS (the floor raises their mix with uniform)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWeights(absl::Span<const float> weights) {
  if (weights.empty()) return absl::InvalidArgumentError("weights: empty");
  bool any_positive = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    const float w = weights[i];
    if (!(std::isfinite(w) && w >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights[", i, "] = ", w, ": weights must be finite and >= 0"));
    }
    any_positive |= w > 0;
  }
  if (!any_positive) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: all ", weights.size(), " weights are 0; at least one must be > 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateIrreducibleLosses(absl::Span<const float> losses, uint64_t num_samples) {
  if (losses.size() != num_samples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "irreducible_losses: ", losses.size(), " values for num_samples ", num_samples));
  }
  for (size_t i = 0; i < losses.size(); ++i) {
    if (weight_math::BadBits(weight_math::FloatBits(losses[i])) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("irreducible_losses[", i, "] = ", losses[i],
                                                     ": must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status NormaliseWeights(absl::Span<float> weights) {
  if (absl::Status s = ValidateWeights(weights); !s.ok()) return s;
  size_t max_at = 0, min_at = 0;  // The largest and the smallest positive weight (first of ties).
  // The sum of the weights as doubles: exact_sum.h, chunk by chunk (the definition of the mean,
  // the same on every machine and for a GPU's reduction).
  std::vector<exact_sum::ChunkSum> chunk_sums;
  double terms[exact_sum::kChunk];
  for (size_t b = 0; b < weights.size(); b += exact_sum::kChunk) {
    const size_t e = std::min(weights.size(), b + exact_sum::kChunk);
    for (size_t i = b; i < e; ++i) {
      const float w = weights[i];
      terms[i - b] = w;
      if (w > weights[max_at]) max_at = i;
      if (w > 0 && (weights[min_at] == 0 || w < weights[min_at])) min_at = i;
    }
    chunk_sums.push_back(exact_sum::SumChunk(terms, e - b));
  }
  const double sum = exact_sum::Total(chunk_sums.data(), chunk_sums.size());
  const double ratio = double{weights[max_at]} / double{weights[min_at]};  // Finite: < 2^277.
  if (ratio > kMaxWeightRatio) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: the largest positive weight (weights[", max_at, "] = ", weights[max_at], ") is ",
        ratio, " (2^", absl::StrFormat("%.1f", std::log2(ratio)), ") times the smallest (weights[",
        min_at, "] = ", weights[min_at],
        "); at most 2^126 is supported (normalised to mean 1, a smaller weight would no longer be "
        "a normal float: it could underflow to 0 and never be drawn, and its importance weight "
        "1/w would overflow); raise the smallest positive weights or set them to 0"));
  }
  // Mean 1: importance weights are then 1 / w.
  const double mean = sum / static_cast<double>(weights.size());
  for (float& w : weights) w = static_cast<float>(w / mean);
  return absl::OkStatus();
}

absl::Status ClassBalancedWeights(absl::Span<const uint32_t> labels, double beta,
                                  absl::Span<float> out) {
  if (labels.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels: ", labels.size(), " values for num_samples ", out.size()));
  }
  if (labels.empty()) return absl::InvalidArgumentError("labels: empty");
  if (!(beta >= 0 && beta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.class_balance_beta = ", beta, " is outside [0, 1)"));
  }
  absl::flat_hash_map<uint32_t, uint64_t> counts;
  for (uint32_t label : labels) ++counts[label];
  absl::flat_hash_map<uint32_t, double> class_weight;
  for (const auto& [label, n] : counts) {
    class_weight[label] = beta == 0 ? 1.0 / static_cast<double>(n)
                                    : (1.0 - beta) / (1.0 - det::Pow(beta, static_cast<double>(n)));
  }
  // Mean of the per-sample weights = sum over classes of n_c * w_c / N, in label order.
  std::vector<uint32_t> sorted_labels;
  sorted_labels.reserve(counts.size());
  for (const auto& [label, n] : counts) sorted_labels.push_back(label);
  std::sort(sorted_labels.begin(), sorted_labels.end());
  double sum = 0;
  for (uint32_t label : sorted_labels)
    sum += static_cast<double>(counts[label]) * class_weight[label];
  const double mean = sum / static_cast<double>(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    out[i] = static_cast<float>(class_weight[labels[i]] / mean);
  }
  return absl::OkStatus();
}

WeightChunkSummary SummarizeWeightChunk(const float* weights, uint64_t count) {
  WeightChunkSummary c;
  c.min = weights[0];
  c.max = weights[0];
  uint64_t zeros = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const float w = weights[i];
    c.min = w < c.min ? w : c.min;
    c.max = w > c.max ? w : c.max;
    zeros += w == 0;
  }
  c.zero_count = zeros;
  // The chunk's largest terms: max and max^2 (both monotone in w >= 0).
  const double max = c.max;
  c.sum.exponent = exact_sum::ChunkExponent(exact_sum::TermBits(max));
  c.sum_of_squares.exponent = exact_sum::ChunkExponent(exact_sum::TermBits(max * max));
  // Each sum in two 64-bit halves (each below 2^44 for 4096 terms below 2^63): no carry is lost
  // and the loop vectorises.
  uint64_t low = 0, high = 0, low_sq = 0, high_sq = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const double w = weights[i];
    const uint64_t q = exact_sum::Quantise(exact_sum::TermBits(w), c.sum.exponent);
    const uint64_t q_sq = exact_sum::Quantise(
        exact_sum::TermBits(weight_math::SquareTerm(weights[i])), c.sum_of_squares.exponent);
    low += q & 0xffffffffu;
    high += q >> 32;
    low_sq += q_sq & 0xffffffffu;
    high_sq += q_sq >> 32;
  }
  c.sum.sum = (static_cast<exact_sum::uint128>(high) << 32) + low;
  c.sum_of_squares.sum = (static_cast<exact_sum::uint128>(high_sq) << 32) + low_sq;
  return c;
}

WeightSummary CombineWeightChunks(absl::Span<const WeightChunkSummary> chunks, uint64_t n) {
  WeightSummary s;
  if (chunks.empty() || n == 0) return s;
  float min = chunks[0].min, max = chunks[0].max;
  std::vector<exact_sum::ChunkSum> sums, squares;
  sums.reserve(chunks.size());
  squares.reserve(chunks.size());
  for (const WeightChunkSummary& c : chunks) {
    min = c.min < min ? c.min : min;
    max = c.max > max ? c.max : max;
    s.zero_count += c.zero_count;
    sums.push_back(c.sum);
    squares.push_back(c.sum_of_squares);
  }
  // -0 and +0 compare equal: which one a comparison keeps depends on the order, so a zero is +0.
  s.min = min == 0 ? 0.0 : double{min};
  s.max = max == 0 ? 0.0 : double{max};
  const double s1 = exact_sum::Total(sums.data(), sums.size());
  const double s2 = exact_sum::Total(squares.data(), squares.size());
  s.mean = s1 / static_cast<double>(n);
  s.effective_sample_size = weight_math::EffectiveSampleSize(s1, s2);
  return s;
}

WeightSummary SummarizeWeights(absl::Span<const float> weights) {
  std::vector<WeightChunkSummary> chunks;
  chunks.reserve((weights.size() + exact_sum::kChunk - 1) / exact_sum::kChunk);
  for (size_t b = 0; b < weights.size(); b += exact_sum::kChunk) {
    chunks.push_back(SummarizeWeightChunk(
        weights.data() + b, std::min<uint64_t>(exact_sum::kChunk, weights.size() - b)));
  }
  return CombineWeightChunks(chunks, weights.size());
}

absl::Status TooManyLossGroups() {
  return absl::InvalidArgumentError(absl::StrCat(
      "base: more than ", kMaxLossGroups,
      " distinct weights; policy.loss_within_groups supports at most ", kMaxLossGroups,
      " groups (the samples of equal base weight): upload fewer distinct weights or classes, or "
      "unset policy.loss_within_groups"));
}

absl::Status CheckLossGroups(const WeightPolicyParams& policy, absl::Span<const float> base) {
  if (!policy.loss_within_groups) return absl::OkStatus();
  LossGroupTable groups;
  if (!FindLossGroups(base.data(), base.size(), kMaxLossGroups, &groups)) {
    return TooManyLossGroups();
  }
  return absl::OkStatus();
}

}  // namespace samplerd
