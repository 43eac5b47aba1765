// The CPU ComputeBackend: multithreaded, deterministic for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/compute_backend.h"
#include "kernels/det_math.h"
#include "kernels/internal/det_math_batch.h"
#include "kernels/internal/draw_table.h"
#include "kernels/internal/es_select.h"
#include "kernels/internal/parallel.h"
#include "kernels/internal/shuffle.h"
#include "kernels/philox.h"

namespace samplerd {
namespace {

using internal::ParallelForChunks;

constexpr uint64_t kGrain = 1 << 16;  // Items per chunk of element-wise work.

absl::Status ValidatePlanInputs(const PlanSpec& spec, absl::Span<const float> weights) {
  if (spec.num_samples == 0) return absl::InvalidArgumentError("num_samples = 0: must be >= 1");
  if (spec.samples_per_epoch == 0) {
    return absl::InvalidArgumentError("samples_per_epoch = 0: must be >= 1");
  }
  if (!spec.replacement && spec.samples_per_epoch > spec.num_samples) {
    return absl::InvalidArgumentError(absl::StrCat("samples_per_epoch = ", spec.samples_per_epoch,
                                                   " exceeds num_samples = ", spec.num_samples,
                                                   " without replacement"));
  }
  if (spec.order == SampleOrder::kSequential &&
      (spec.replacement || spec.samples_per_epoch != spec.num_samples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order = SEQUENTIAL needs replacement = false and samples_per_epoch = num_samples; got "
        "replacement = ",
        spec.replacement, ", samples_per_epoch = ", spec.samples_per_epoch));
  }
  if (!weights.empty()) {
    if (weights.size() != spec.num_samples) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: ", weights.size(), " values for num_samples ", spec.num_samples));
    }
  }
  return absl::OkStatus();
}

// ValidateWeights (finite, >= 0, not all 0) in parallel; the number of positive weights.
absl::StatusOr<uint64_t> CountPositiveWeights(int threads, absl::Span<const float> weights) {
  const uint64_t n = weights.size();
  std::vector<uint64_t> positive(internal::NumChunks(n, kGrain), 0);
  std::vector<uint8_t> bad(positive.size(), 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    // On the IEEE bits (so that it vectorises): finite and >= 0 is [+0, +inf) or -0;
    // positive is (+0, +inf).
    uint64_t count = 0, bad_count = 0;
    for (uint64_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &weights[i], sizeof bits);
      bad_count += (bits >= 0x7f800000u) & (bits != 0x80000000u);
      count += bits - 1u < 0x7f7fffffu;
    }
    positive[c] = count;
    bad[c] = bad_count > 0;
  });
  uint64_t total = 0;
  for (uint64_t c : positive) total += c;
  if (total == 0 || std::find(bad.begin(), bad.end(), 1) != bad.end()) {
    return ValidateWeights(weights);  // Names the first bad weight (or all zero).
  }
  return total;
}

// Checks the sizes and values of RecomputeWeights' inputs; the message names the first bad
// entry (the lowest index, whatever the thread count).
absl::Status ValidateRecomputeInputs(int threads, const WeightPolicyParams& policy,
                                     absl::Span<const float> base, absl::Span<const float> current,
                                     LossStatsView stats, absl::Span<float> out) {
  const size_t n = out.size();
  if (n == 0) return absl::InvalidArgumentError("weights: num_samples = 0");
  auto size_error = [n](const char* field, size_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", got, " values for num_samples ", n));
  };
  if (!base.empty() && base.size() != n) return size_error("base", base.size());
  if (current.size() != n) return size_error("current", current.size());
  if (stats.size() != n) return size_error("stats", stats.size());
  auto valid_weight = [](float w) { return std::isfinite(w) && w >= 0; };
  // The EMA is defined once a loss was applied (count > 0 or a last epoch).
  auto valid_stats = [](const SampleLossStats& s) {
    return (s.count == 0 && s.last_epoch == 0) || (std::isfinite(s.ema_loss) && s.ema_loss >= 0);
  };
  auto bad = [&](uint64_t i) {
    return (!base.empty() && !valid_weight(base[i])) || !valid_weight(current[i]) ||
           !valid_stats(stats[i]);
  };
  constexpr uint64_t kNone = ~uint64_t{0};
  std::vector<uint64_t> first_bad(internal::NumChunks(n, kGrain), kNone);
  std::vector<uint8_t> base_positive(first_bad.size(), 0), current_positive(first_bad.size(), 0);
  ParallelForChunks(threads, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
    bool any_base = false, any_current = false;
    for (uint64_t i = b; i < e; ++i) {
      if (bad(i)) {
        first_bad[c] = i;
        return;
      }
      any_base |= !base.empty() && base[i] > 0;
      any_current |= current[i] > 0;
    }
    base_positive[c] = any_base;
    current_positive[c] = any_current;
  });
  for (uint64_t i : first_bad) {
    if (i == kNone) continue;
    if (!base.empty() && !valid_weight(base[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("base[", i, "] = ", base[i], ": must be finite and >= 0"));
    }
    if (!valid_weight(current[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("current[", i, "] = ", current[i], ": must be finite and >= 0"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("stats[", i, "].ema_loss = ", stats[i].ema_loss, ": must be finite and >= 0"));
  }
  auto any = [](const std::vector<uint8_t>& v) {
    return std::find(v.begin(), v.end(), 1) != v.end();
  };
  if (!base.empty() && !any(base_positive)) {
    return absl::InvalidArgumentError(
        absl::StrCat("base: all ", n, " weights are 0; at least one must be > 0"));
  }
  if (policy.loss == LossWeightKind::kMultiplicative && !any(current_positive)) {
    return absl::InvalidArgumentError(
        absl::StrCat("current: all ", n, " weights are 0; at least one must be > 0"));
  }
  return absl::OkStatus();
}

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(int num_threads) : threads_(num_threads) {}

  std::string name() const override { return "cpu"; }

  absl::Status RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                absl::Span<const float> base, absl::Span<const float> current,
                                LossStatsView stats, absl::Span<float> out) override;

  absl::StatusOr<Plan> PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                 absl::Span<const float> weights) override;

  uint64_t PlanScratchBytes(const PlanSpec& spec, bool weighted) const override;

  absl::Status ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank, uint64_t start,
                            absl::Span<uint64_t> out) override;

  absl::Status ShardWithoutPlan(const PlanSpec& spec, uint64_t epoch, const ShardSpec& shard,
                                uint32_t rank, uint64_t start, absl::Span<uint64_t> out) override;

 private:
  // Sum of f(i) over [0, n), in double, combined in chunk order (thread-count independent).
  template <typename F>
  double DeterministicSum(uint64_t n, const F& f) const {
    std::vector<double> partial(internal::NumChunks(n, kGrain), 0.0);
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
      double s = 0;
      for (uint64_t i = b; i < e; ++i) s += f(i);
      partial[c] = s;
    });
    double total = 0;
    for (double s : partial) total += s;
    return total;
  }

  // Sizes `indices` to M and writes the plan (validated inputs) into it: uint32_t when
  // N <= 2^32, else uint64_t.
  template <typename T>
  void FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                LargeVector<T>& indices) const;

  // out[i] = the weights raw(i) (finite, >= 0, not all 0 where not excluded) scaled to mean 1,
  // clamped to [lo, hi], scaled to mean 1 again; excluded samples (a zero base or current
  // weight) get exactly 0, so they are never drawn. raw(i) and excluded(i) may read out[i]: the
  // last pass reads them for sample i before it writes out[i].
  template <typename Raw, typename Excluded>
  void NormaliseClampWrite(const Raw& raw, const Excluded& excluded, double lo, double hi,
                           absl::Span<float> out) const {
    const uint64_t n = out.size();
    const double mean = DeterministicSum(n, raw) / static_cast<double>(n);
    // mean == 0: every raw weight vanished (e.g. all loss factors underflowed against a sample
    // that the base excludes); the samples that are not excluded are then equal.
    auto clamped = [&](uint64_t i) {
      return excluded(i) ? 0.0 : std::clamp(mean > 0 ? raw(i) / mean : 1.0, lo, hi);
    };
    const double mean2 = DeterministicSum(n, clamped) / static_cast<double>(n);
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) out[i] = static_cast<float>(clamped(i) / mean2);
    });
  }

  const int threads_;
};

absl::Status CpuBackend::RecomputeWeights(const WeightPolicyParams& policy, uint64_t closed_epoch,
                                          absl::Span<const float> base,
                                          absl::Span<const float> current, LossStatsView stats,
                                          absl::Span<float> out) {
  if (absl::Status s = ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = ValidateRecomputeInputs(threads_, policy, base, current, stats, out);
      !s.ok()) {
    return s;
  }
  const uint64_t n = out.size();
  auto base_at = [&](uint64_t i) { return base.empty() ? 1.0 : double{base[i]}; };
  auto zero_base = [&](uint64_t i) { return !base.empty() && base[i] == 0; };

  switch (policy.loss) {
    case LossWeightKind::kNone: {
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) out[i] = static_cast<float>(base_at(i));
      });
      return absl::OkStatus();
    }
    case LossWeightKind::kLoss: {
      // One pass over the statistics: per chunk, the number of seen samples, the sum and the
      // maximum of their EMAs, and whether any sample is unseen (combined in chunk order).
      struct ChunkStats {
        double seen = 0, ema_sum = 0, ema_max = 0;
        bool unseen = false;
      };
      std::vector<ChunkStats> chunk_stats(internal::NumChunks(n, kGrain));
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
        ChunkStats cs;
        for (uint64_t i = b; i < e; ++i) {
          if (stats[i].count > 0) {
            const double ema = stats[i].ema_loss;
            cs.seen += 1;
            cs.ema_sum += ema;
            cs.ema_max = std::max(cs.ema_max, ema);
          } else {
            cs.unseen = true;
          }
        }
        chunk_stats[c] = cs;
      });
      ChunkStats all;
      for (const ChunkStats& cs : chunk_stats) {
        all.seen += cs.seen;
        all.ema_sum += cs.ema_sum;
        all.ema_max = std::max(all.ema_max, cs.ema_max);
        all.unseen |= cs.unseen;
      }
      // Prior loss of samples never seen: configured, or the mean EMA of the seen samples.
      double prior = 0;
      if (policy.prior_loss.has_value()) {
        prior = *policy.prior_loss;
      } else if (all.seen > 0) {
        prior = all.ema_sum / all.seen;
      }
      auto x = [&](uint64_t i) {
        return (stats[i].count > 0 ? double{stats[i].ema_loss} : prior) + policy.epsilon;
      };
      // f_i = (x_i / x_max)^alpha, in (0, 1]: (x_i)^alpha up to a common factor, which the
      // normalisation removes, computed without overflow (losses near the float maximum with
      // alpha 8 would overflow even a double). x_max = max(v_i) + epsilon is max(v_i +
      // epsilon) (rounding is monotone), exact and order-independent.
      const double x_max =
          std::max(all.seen > 0 ? all.ema_max : 0.0, all.unseen ? prior : 0.0) + policy.epsilon;
      const double log2_x_max = det::Log2(x_max);
      // f is computed once and parked in `out` (validation is over, so writing is allowed; out
      // may alias `current`, which the loss policy does not read), in blocks through the
      // vectorised det::Log2 / det::Exp2. A factor that underflows to 0 is harmless: the clamp
      // lifts every sample with a positive base weight to clamp_lo.
      std::vector<double> chunk_sum(internal::NumChunks(n, kGrain), 0.0);
      ParallelForChunks(threads_, n, kGrain, [&](uint64_t c, uint64_t b, uint64_t e) {
        constexpr uint64_t kBlock = 512;
        double f[kBlock];
        double sum = 0;
        for (uint64_t k = b; k < e; k += kBlock) {
          const uint64_t count = std::min(kBlock, e - k);
          for (uint64_t j = 0; j < count; ++j) f[j] = x(k + j);
          if (policy.alpha == 1.0) {
            for (uint64_t j = 0; j < count; ++j) f[j] /= x_max;
          } else {  // (x / x_max)^alpha = 2^(alpha (log2 x - log2 x_max)).
            internal::Log2Many(f, count, f);
            for (uint64_t j = 0; j < count; ++j) f[j] = policy.alpha * (f[j] - log2_x_max);
            internal::Exp2Many(f, count, f);
          }
          for (uint64_t j = 0; j < count; ++j) {
            out[k + j] = static_cast<float>(f[j]);
            sum += double{out[k + j]};
          }
        }
        chunk_sum[c] = sum;
      });
      double total_f = 0;
      for (double sum : chunk_sum) total_f += sum;
      const double mean_f = total_f / static_cast<double>(n);
      const double mix = policy.mix;
      NormaliseClampWrite(
          [&](uint64_t i) { return base_at(i) * ((1.0 - mix) * out[i] / mean_f + mix); }, zero_base,
          policy.clamp_lo, policy.clamp_hi, out);
      return absl::OkStatus();
    }
    case LossWeightKind::kMultiplicative: {
      const uint16_t seen_marker = EpochMarker(closed_epoch);
      // In double: w (1 + eta ema) may pass the float range before the normalisation.
      NormaliseClampWrite(
          [&](uint64_t i) {
            const double w = current[i];
            return stats[i].last_epoch == seen_marker ? w * (1.0 + policy.eta * stats[i].ema_loss)
                                                      : w;
          },
          [&](uint64_t i) { return current[i] == 0; }, policy.clamp_lo, policy.clamp_hi, out);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("policy.loss: unknown kind");
}

absl::StatusOr<Plan> CpuBackend::PlanEpoch(const PlanSpec& spec, uint64_t epoch,
                                           absl::Span<const float> weights) {
  if (absl::Status s = ValidatePlanInputs(spec, weights); !s.ok()) return s;
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  uint64_t positive = n;
  if (!weights.empty()) {
    absl::StatusOr<uint64_t> count = CountPositiveWeights(threads_, weights);
    if (!count.ok()) return count.status();
    positive = *count;
  }
  if (!spec.replacement && spec.order == SampleOrder::kWeightedRandom) {
    // Without replacement every drawn sample must have a positive weight.
    if (positive < m) {
      return absl::FailedPreconditionError(
          absl::StrCat("samples_per_epoch = ", m, " without replacement needs ", m,
                       " samples with positive weight; ", positive, " have one"));
    }
  }
  Plan plan;
  plan.epoch = epoch;
  plan.num_samples = n;
  if (Plan::Narrow(n)) {
    FillPlan(spec, epoch, weights, plan.indices32);
  } else {
    FillPlan(spec, epoch, weights, plan.indices64);
  }
  return plan;
}

uint64_t CpuBackend::PlanScratchBytes(const PlanSpec& spec, bool weighted) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  // Beyond 2^56 the byte counts below could overflow; no machine holds such a plan anyway.
  constexpr uint64_t kHuge = uint64_t{1} << 56;
  if (n > kHuge || m > kHuge) return ~uint64_t{0};
  // CountPositiveWeights: a count and a flag per chunk.
  const uint64_t validation = weighted ? internal::NumChunks(n, kGrain) * 9 : 0;
  // What FillPlan allocates besides the plan, path by path.
  uint64_t fill = 0;
  if (spec.order == SampleOrder::kSequential) {
    fill = 0;
  } else if (spec.replacement) {
    fill = weighted ? internal::DrawTableBytes(n) : 0;  // Uniform draws need no table.
  } else if (m == n) {
    fill = internal::ShuffleScratchBytes(threads_, m);
  } else {
    // The selection, then the shuffle of the selected indices (which stay alive meanwhile).
    fill = std::max(internal::SelectScratchBytes(threads_, n, m),
                    m * sizeof(uint64_t) + internal::ShuffleScratchBytes(threads_, m));
  }
  return validation + fill;
}

template <typename T>
void CpuBackend::FillPlan(const PlanSpec& spec, uint64_t epoch, absl::Span<const float> weights,
                          LargeVector<T>& indices) const {
  const uint64_t n = spec.num_samples, m = spec.samples_per_epoch;
  // Not written here: the threads below touch its pages first, in parallel (large_array.h).
  indices.resize(m);
  const absl::Span<T> out = absl::MakeSpan(indices);
  if (spec.order == SampleOrder::kSequential) {
    ParallelForChunks(threads_, n, kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) out[i] = static_cast<T>(i);
    });
  } else if (spec.replacement) {
    if (weights.empty()) {
      internal::DrawUniform(threads_, spec.seed, epoch, n, 0, out);
    } else {
      const internal::DrawTable table = internal::BuildDrawTable(threads_, weights);
      internal::DrawWeighted(threads_, table, spec.seed, epoch, 0, out);
    }
  } else if (spec.EveryIndexOnce()) {
    // Every sample exactly once: the weights cannot matter, only the order.
    internal::ShuffleRange(threads_, spec.seed, epoch, out);
  } else {
    const std::vector<uint64_t> selected =
        internal::SelectEfraimidisSpirakis(threads_, spec.seed, epoch, n, m, weights);
    internal::ShuffleIndices(threads_, spec.seed, epoch, absl::MakeConstSpan(selected), out);
  }
}

absl::Status CpuBackend::ExtractShard(const Plan& plan, const ShardSpec& shard, uint32_t rank,
                                      uint64_t start, absl::Span<uint64_t> out) {
  const uint64_t m = plan.size();
  absl::StatusOr<uint64_t> length = ShardLength(m, shard, rank);
  if (!length.ok()) return length.status();
  if (start > *length || out.size() > *length - start) {
    return absl::InvalidArgumentError(absl::StrCat("shard range [", start, ", ", start + out.size(),
                                                   ") passes the shard length ", *length));
  }
  auto copy = [&](const auto& indices) {
    for (uint64_t k = 0; k < out.size(); ++k) {
      out[k] = indices[ShardToPlanPosition(m, shard, rank, start + k)];
    }
  };
  if (Plan::Narrow(plan.num_samples)) {
    copy(plan.indices32);
  } else {
    copy(plan.indices64);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ShardWithoutPlan(const PlanSpec& spec, uint64_t epoch,
                                          const ShardSpec& shard, uint32_t rank, uint64_t start,
                                          absl::Span<uint64_t> out) {
  if (absl::Status s = ValidatePlanInputs(spec, {}); !s.ok()) return s;
  const bool independent = spec.order == SampleOrder::kSequential || spec.replacement;
  if (!independent) {
    return absl::UnimplementedError(
        "ShardWithoutPlan: positions of a plan without replacement depend on each other; use "
        "PlanEpoch + ExtractShard");
  }
  const uint64_t m = spec.samples_per_epoch;
  absl::StatusOr<uint64_t> length = ShardLength(m, shard, rank);
  if (!length.ok()) return length.status();
  if (start > *length || out.size() > *length - start) {
    return absl::InvalidArgumentError(absl::StrCat("shard range [", start, ", ", start + out.size(),
                                                   ") passes the shard length ", *length));
  }
  ParallelForChunks(threads_, out.size(), kGrain, [&](uint64_t, uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      const uint64_t p = ShardToPlanPosition(m, shard, rank, start + k);
      out[k] = spec.order == SampleOrder::kSequential
                   ? p
                   : internal::UniformDraw(spec.seed, epoch, spec.num_samples, p);
    }
  });
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<ComputeBackend> NewCpuBackend(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace samplerd
