#include "kernels/mixture/group_weights.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/det_math.h"
#include "kernels/mixture/apportion.h"

namespace samplerd {
namespace mixture {
namespace {

constexpr double kLog2E = 1.4426950408889634;  // log2(e): z in base 2 for exp(eta x).

absl::Status ValidateBounds(const WeightBounds& b) {
  if (!(b.min_ratio >= 0 && b.min_ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bounds.min_ratio = ", b.min_ratio, ": in [0, 1] (a group's least weight over uniform)"));
  }
  if (!(b.max_ratio >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bounds.max_ratio = ", b.max_ratio,
                     ": >= 1, or +inf (a group's most weight over uniform)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateUnit(const char* field, double x, bool one_allowed) {
  if (!(x >= 0 && (one_allowed ? x <= 1 : x < 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", x, one_allowed ? ": in [0, 1]" : ": in [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEta(double eta) {
  if (!(std::isfinite(eta) && eta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("eta = ", eta, ": finite and > 0"));
  }
  return absl::OkStatus();
}

// Initial weights: normalised, then projected onto the bounds.
absl::StatusOr<std::vector<double>> Initial(absl::Span<const double> initial,
                                            const WeightBounds& bounds) {
  absl::StatusOr<std::vector<double>> w = NormalizeWeights(initial, initial.size());
  if (!w.ok()) return w.status();
  const double k = static_cast<double>(w->size());
  std::vector<uint32_t> all(w->size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  ProjectOntoBounds(all, 1.0, bounds.min_ratio / k, bounds.max_ratio / k, absl::MakeSpan(*w));
  return w;
}

// sum over members of min(max(v_k - t, lo), hi), in member order.
double Clipped(absl::Span<const uint32_t> members, absl::Span<const double> v, double t, double lo,
               double hi) {
  double sum = 0;
  for (uint32_t k : members) sum += std::min(std::max(v[k] - t, lo), hi);
  return sum;
}

}  // namespace

absl::StatusOr<std::vector<double>> NormalizeWeights(absl::Span<const double> weights,
                                                     uint64_t groups) {
  if (weights.size() != groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", weights.size(), " weights for ", groups, " groups"));
  }
  // SharesOf holds the rule on the values (finite, >= 0, not all 0) and its messages.
  if (absl::StatusOr<std::vector<uint64_t>> shares = SharesOf(weights); !shares.ok()) {
    return shares.status();
  }
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<double> out(weights.size());
  if (std::isinf(sum)) {
    // Finite weights whose sum overflows ({1e308, 1e308}): each over the largest first (each
    // in [0, 1], the sum at most K). Only then, so other weights keep their bits.
    double w_max = 0;
    for (double w : weights) w_max = std::max(w_max, w);
    sum = 0;
    for (size_t k = 0; k < weights.size(); ++k) {
      out[k] = weights[k] / w_max;
      sum += out[k];
    }
    for (double& w : out) w = (w + 0.0) / sum;  // -0 as 0.
    return out;
  }
  for (size_t k = 0; k < weights.size(); ++k) out[k] = (weights[k] + 0.0) / sum;  // -0 as 0.
  return out;
}

void ProjectOntoBounds(absl::Span<const uint32_t> members, double mass, double lo, double hi,
                       absl::Span<double> v) {
  const size_t n = members.size();
  if (n == 0) return;
  bool within = true;
  for (uint32_t k : members) within = within && v[k] >= lo && v[k] <= hi;
  if (within) return;
  const double count = static_cast<double>(n);
  if (count * lo >= mass || count * hi <= mass) {
    const double all = count * lo >= mass ? lo : hi;
    for (uint32_t k : members) v[k] = all;
    return;
  }
  // The sum g(t) falls from n hi (t at or below every v_k - hi) to n lo (t at or above every
  // v_k - lo), linearly between consecutive breakpoints.
  std::vector<double> breaks;
  breaks.reserve(2 * n);
  for (uint32_t k : members) {
    breaks.push_back(v[k] - hi);
    breaks.push_back(v[k] - lo);
  }
  std::sort(breaks.begin(), breaks.end());
  size_t a = 0, b = 2 * n - 1;  // g(breaks[a]) > mass >= g(breaks[b]).
  while (b - a > 1) {
    const size_t mid = a + (b - a) / 2;
    if (Clipped(members, v, breaks[mid], lo, hi) <= mass) {
      b = mid;
    } else {
      a = mid;
    }
  }
  const double ta = breaks[a], tb = breaks[b];
  // On [ta, tb] each member is at hi (v - hi >= tb), at lo (v - lo <= ta) or free (v - t).
  double fixed = 0, free_sum = 0, free_count = 0;
  for (uint32_t k : members) {
    if (v[k] - hi >= tb) {
      fixed += hi;
    } else if (v[k] - lo <= ta) {
      fixed += lo;
    } else {
      free_sum += v[k];
      free_count += 1;
    }
  }
  double t = free_count > 0 ? (free_sum + fixed - mass) / free_count : tb;
  t = std::min(std::max(t, ta), tb);  // Rounding.
  for (uint32_t k : members) v[k] = std::min(std::max(v[k] - t, lo), hi);
}

absl::StatusOr<GroupWeights> GroupWeights::Static(absl::Span<const double> weights) {
  absl::StatusOr<std::vector<double>> w = NormalizeWeights(weights, weights.size());
  if (!w.ok()) return w.status();
  return GroupWeights(GroupWeightRule::kStatic, *std::move(w));
}

absl::Status ValidateReferenceLosses(absl::Span<const double> reference, uint64_t groups) {
  if (reference.size() != groups) {
    return absl::InvalidArgumentError(absl::StrCat("reference_losses: ", reference.size(),
                                                   " reference losses for ", groups, " groups"));
  }
  for (size_t k = 0; k < reference.size(); ++k) {
    if (!std::isfinite(reference[k]) || reference[k] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("reference_losses[", k, "] = ", reference[k],
                                                     ": reference losses are finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GroupWeights> GroupWeights::ExcessLoss(absl::Span<const double> initial,
                                                      absl::Span<const double> reference,
                                                      const ExcessLossConfig& config) {
  if (absl::Status s = ValidateEta(config.eta); !s.ok()) return s;
  if (absl::Status s = ValidateUnit("smoothing", config.smoothing, true); !s.ok()) return s;
  if (absl::Status s = ValidateUnit("loss_decay", config.loss_decay, false); !s.ok()) return s;
  if (!(config.horizon > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("horizon = ", config.horizon, ": > 0 epochs, or +inf (no stall floor)"));
  }
  if (absl::Status s = ValidateBounds(config.bounds); !s.ok()) return s;
  absl::StatusOr<std::vector<double>> w = Initial(initial, config.bounds);
  if (!w.ok()) return w.status();
  if (absl::Status s = ValidateReferenceLosses(reference, w->size()); !s.ok()) return s;
  GroupWeights out(GroupWeightRule::kExcessLoss, *std::move(w));
  out.reference_.assign(reference.begin(), reference.end());
  out.excess_ = config;
  return out;
}

absl::StatusOr<GroupWeights> GroupWeights::Exp3(absl::Span<const double> initial,
                                                const Exp3Config& config) {
  if (absl::Status s = ValidateEta(config.eta); !s.ok()) return s;
  if (absl::Status s = ValidateUnit("exploration", config.exploration, true); !s.ok()) return s;
  if (absl::Status s = ValidateUnit("reward_decay", config.reward_decay, false); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateUnit("loss_decay", config.loss_decay, false); !s.ok()) return s;
  if (absl::Status s = ValidateBounds(config.bounds); !s.ok()) return s;
  absl::StatusOr<std::vector<double>> w = Initial(initial, config.bounds);
  if (!w.ok()) return w.status();
  GroupWeights out(GroupWeightRule::kExp3, *std::move(w));
  out.exp3_ = config;
  return out;
}

absl::Status GroupWeights::SetStatic(absl::Span<const double> weights) {
  if (rule_ != GroupWeightRule::kStatic) {
    return absl::FailedPreconditionError(
        "weights: the job's group weights are learned online; static weights are set only on a "
        "job created with static weights");
  }
  absl::StatusOr<std::vector<double>> w = NormalizeWeights(weights, groups());
  if (!w.ok()) return w.status();
  weights_ = *std::move(w);
  return absl::OkStatus();
}

absl::Status GroupWeights::Restore(absl::Span<const double> weights,
                                   absl::Span<const GroupTrack> tracks) {
  if (weights.size() != groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", weights.size(), " weights for ", groups(), " groups"));
  }
  if (tracks.size() != groups() && !(tracks.empty() && rule_ == GroupWeightRule::kStatic)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tracks: ", tracks.size(), " group tracks for ", groups(), " groups"));
  }
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!std::isfinite(weights[k]) || weights[k] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights[", k, "] = ", weights[k], ": weights are finite and >= 0"));
    }
  }
  weights_.assign(weights.begin(), weights.end());
  if (tracks.empty()) {
    tracks_.assign(groups(), GroupTrack{});
  } else {
    tracks_.assign(tracks.begin(), tracks.end());
  }
  return absl::OkStatus();
}

std::vector<double> GroupWeights::Excess() const {
  std::vector<double> out;
  if (rule_ != GroupWeightRule::kExcessLoss) return out;
  out.resize(groups(), 0.0);
  for (uint32_t k = 0; k < groups(); ++k) {
    const GroupTrack& g = tracks_[k];
    if (!g.seen) continue;
    double level = reference_[k];  // max(ref_k, f_k); H = +inf: no floor.
    if (std::isfinite(excess_.horizon)) {
      level = std::max(level, g.ema - excess_.horizon * std::max(g.decrease, 0.0));
    }
    out[k] = std::max(0.0, g.ema - level);
  }
  return out;
}

absl::Status GroupWeights::Update(const GroupLosses& losses) {
  if (losses.groups() != groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("losses: statistics of ", losses.groups(), " groups for a job of ", groups()));
  }
  if (rule_ == GroupWeightRule::kStatic) return absl::OkStatus();
  std::vector<uint32_t> members;  // O.
  double mass = 0;                // P.
  for (uint32_t k = 0; k < groups(); ++k) {
    if (losses.count(k) == 0) continue;
    members.push_back(k);
    mass += weights_[k];
  }
  const bool exp3 = rule_ == GroupWeightRule::kExp3;
  const double decay = exp3 ? exp3_.loss_decay : excess_.loss_decay;
  // Step 1 (for every member, also when P = 0: the losses were seen).
  std::vector<double> drop(groups(), 0.0);  // r_k.
  for (uint32_t k : members) {
    GroupTrack& g = tracks_[k];
    const double l = losses.Mean(k);
    if (!g.seen) {
      g = GroupTrack{true, l, 0.0, g.reward};
      continue;
    }
    const double ema = decay * g.ema + (1.0 - decay) * l;
    drop[k] = g.ema - ema;
    g.ema = ema;
    g.decrease = decay * g.decrease + (1.0 - decay) * drop[k];
  }
  if (members.empty() || !(mass > 0)) return absl::OkStatus();  // No weight to move.
  // Step 2.
  const double n = static_cast<double>(members.size());
  std::vector<double> z(groups(), 0.0);
  if (exp3) {
    for (uint32_t k : members) {
      GroupTrack& g = tracks_[k];
      // The group's probability relative to uniform over O; a group drawn with weight 0 (on its
      // apportionment lag alone) counts as 1.
      const double relative = weights_[k] > 0 ? n * weights_[k] / mass : 1.0;
      g.reward = exp3_.reward_decay * g.reward + (1.0 - exp3_.reward_decay) * (drop[k] / relative);
      z[k] = (exp3_.eta * g.reward) * kLog2E;
    }
  } else {
    const std::vector<double> excess = Excess();
    for (uint32_t k : members) {
      z[k] = det::Log2(weights_[k]) + (excess_.eta * excess[k]) * kLog2E;
    }
  }
  // Step 3.
  double top = z[members[0]];
  for (uint32_t k : members) top = std::max(top, z[k]);
  double total = 0;
  for (uint32_t k : members) {
    z[k] = det::Exp2(z[k] - top);
    total += z[k];
  }
  const double c = exp3 ? exp3_.exploration : excess_.smoothing;
  std::vector<double> next = weights_;
  for (uint32_t k : members) next[k] = ((1.0 - c) * (z[k] / total) + c / n) * mass;
  // Step 4.
  const WeightBounds& bounds = exp3 ? exp3_.bounds : excess_.bounds;
  const double groups_d = static_cast<double>(groups());
  ProjectOntoBounds(members, mass, bounds.min_ratio / groups_d, bounds.max_ratio / groups_d,
                    absl::MakeSpan(next));
  weights_ = std::move(next);
  return absl::OkStatus();
}

}  // namespace mixture
}  // namespace samplerd
